"""`mavjet gateway`: the process entry. Flags, config, preflight checks, then the daemon (gateway/daemon.py).

`main` resolves the config (flag > environment > file > default), checks what
would only fail later (`preflight`: exit 2 with one line), and runs `serve`:
the `Gateway` with its services, the signal handling, and the process-wide
settings (`tune_process`) once the gateway is ready. With `--workers N` it
starts the workers' supervisor instead (gateway/runtime/workers.py).
"""

from __future__ import annotations

import argparse
import errno
import gc
import importlib.util
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Mapping
from functools import partial
from pathlib import Path

import anyio
import structlog

from mavjet.contract import natsconn
from mavjet.contract.errors import ConfigError, MavjetError
from mavjet.contract.redact import redact
from mavjet.drivers.mavlink.dialect import fastcrc_available
from mavjet.gateway.config import GatewayConfig
from mavjet.gateway.daemon import Gateway, with_services
from mavjet.gateway.resolve import load_toml, resolve_config
from mavjet.gateway.runtime import logs
from mavjet.gateway.runtime.layout import check_layout

log = structlog.get_logger("mavjet.gateway")

# How often a thread waiting for the GIL gets it from a busy one (CPython's default: 5 ms).
GIL_SWITCH_INTERVAL_S = 0.001


def tune_process() -> None:
    """Process-wide settings for a gateway process, applied once it is ready.

    Called by the process entry (`serve`) and the benchmarks, never by
    `Gateway` itself: tests run many gateways in one process and must not
    inherit a frozen heap. Everything allocated by startup lives for the whole
    run, so it is kept out of the collector's way; the hot path allocates
    short-lived, acyclic objects (messages, payloads), so young collections
    can run less often.

    The GIL changes hands every `GIL_SWITCH_INTERVAL_S`: the event loop shares
    the process with the SQLite worker threads (command ledger, event spool)
    and the metrics server, and each statement a worker runs takes the GIL
    back from a busy loop, waiting out a whole interval each time. A command's
    in-flight commit is several such waits. At 1,000 vehicles and 10 cmd/s,
    1 ms instead of 5 took command p99 from 229-488 ms to 84-139 ms (three
    alternated runs each, docs/benchmarks.md); the CPU per MAVLink message
    at 2,000 vehicles rose about 1 %, within the runs' spread.
    """
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)


async def serve(cfg: GatewayConfig, *, commands: bool = True, shadow: bool = True,
                hub_sockets: Mapping[str, socket.socket] | None = None,
                metrics_socket: socket.socket | None = None) -> int:
    gw = with_services(Gateway(cfg, hub_sockets=hub_sockets, metrics_socket=metrics_socket),
                       commands=commands, shadow=shadow)

    async def tune_when_ready() -> None:
        await gw.ready.wait()
        tune_process()

    async def on_signals() -> None:
        # Keep receiving for the whole run: a second SIGTERM during shutdown
        # (Ctrl-C reaches the whole process group, then a supervisor's
        # SIGTERM follows) must not kill the drain half way.
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for sig in signals:
                name = signal.Signals(sig).name
                if gw.stopping.is_set():
                    log.info("already_stopping", signal=name)
                else:
                    gw.request_stop(name)

    async with anyio.create_task_group() as tg:
        tg.start_soon(on_signals, name="gateway.signals")
        tg.start_soon(tune_when_ready, name="gateway.tune_process")
        await gw.run()
        tg.cancel_scope.cancel()
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mavjet gateway",
        description="Bridge MAVLink vehicles to their JetStream digital twins.",
        epilog="Example: mavjet gateway --nats nats://127.0.0.1:4222 --vehicle VID-001=tcp:127.0.0.1:5760\n"
        "Endpoints: tcp:HOST:PORT (client, e.g. ArduPilot SITL 5760+10*N), udp:HOST:PORT (listen), "
        "udpout:HOST:PORT, serial:/dev/ttyACM0:115200. Config keys: docs/config.md.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    natsconn.add_nats_arguments(p, env_defaults=False)  # resolved with the config file: resolve_config
    p.add_argument("--vehicle", action="append", default=[], metavar="VID=ENDPOINT",
                   help="a vehicle to serve (repeatable); overrides the config file's entry with the same VID")
    p.add_argument("--backup", action="append", default=[], metavar="VID=ENDPOINT",
                   help="a second link to a vehicle (repeatable): both are read, commands go on the live one, "
                   "and the gateway switches within 2 s of the primary going quiet (docs/ownership.md)")
    p.add_argument("--route", action="append", default=[], metavar="ENDPOINT",
                   help="a ground station's endpoint (repeatable): udp:HOST:PORT (listen), udpout:HOST:PORT, "
                   "tcp:HOST:PORT (server); options ?vid=VID&sysid=N,N&compid=N (docs/companion.md)")
    p.add_argument("--config", type=Path, help="TOML config file (see deploy/gateway.example.toml)")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port (0 = any free port)")
    p.add_argument("--metrics-host", help="address for the metrics endpoint (default 127.0.0.1)")
    p.add_argument("--state-dir", type=Path, help="where the spool and ledgers live (default .mavjet/state)")
    p.add_argument("--instance", help="gateway instance name in events and logs (default: hostname)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="the lowest level logged (default %(default)s)")
    p.add_argument("--log-json", action="store_true", default=None, help="JSON logs even on a TTY")
    p.add_argument("--uvloop", action="store_true", default=None, help="use uvloop (edge hubs with many vehicles)")
    p.add_argument("--track-hz", type=float, metavar="HZ",
                   help="flight recorder: position samples per second to TWIN_TRACKS while armed "
                   "(default 1; 0 = off; env MAVJET_TRACK_HZ)")
    p.add_argument("--workers", type=int, metavar="N",
                   help="run N processes that split the vehicles, one metrics endpoint (default 1; env MAVJET_WORKERS; "
                   "docs/deploy.md)")
    p.add_argument("--worker-slot", metavar="I/N", help=argparse.SUPPRESS)  # set by --workers for its processes
    p.add_argument("--jetstream-domain", metavar="DOMAIN",
                   help="the hub's JetStream domain, for a gateway on a companion's leaf node: commands, shadow, leases "
                   "and blobs are the hub's, events stay in the leaf's own streams ([nats] domain; docs/companion.md)")
    p.add_argument("--no-commands", action="store_true", help="telemetry only: do not consume TWIN_CMD")
    p.add_argument("--no-shadow", action="store_true", help="do not reconcile TWIN_SHADOW desired documents")
    return p


def config_from_args(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> GatewayConfig:
    """flag > environment > file > default, resolved in `mavjet.gateway.resolve.resolve_config`."""
    return resolve_config(load_toml(args.config), flags=vars(args), environ=environ)


def preflight(cfg: GatewayConfig) -> None:
    """What would fail later, checked before anything starts; raises ConfigError naming the key.

    A missing creds or TLS file, a state dir we cannot write, a metrics port
    already taken, `uvloop = true` without uvloop installed: none of them
    gets better by retrying, so the gateway exits 2 with one line instead of
    a traceback or an endless NATS retry. An unreachable server is not
    checked here: it may come up later, and the publisher keeps retrying
    with backoff.
    """
    cfg.nats.check_files()
    if cfg.uvloop and importlib.util.find_spec("uvloop") is None:
        raise ConfigError("uvloop", "is true but uvloop is not installed (pip install 'mavjet[edge]')")
    try:
        cfg.state_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=cfg.state_dir):
            pass
    except OSError as exc:
        raise ConfigError("state_dir", f"{cfg.state_dir} is not writable: {exc.strerror or exc}") from None
    for r in cfg.routes:  # a route's listening port taken by another process: say so before starting
        if r.endpoint.scheme in ("udp", "tcp"):
            kind = socket.SOCK_DGRAM if r.endpoint.scheme == "udp" else socket.SOCK_STREAM
            try:
                with socket.socket(socket.AF_INET, kind) as s:
                    if kind == socket.SOCK_STREAM:
                        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the route server binds
                    s.bind((r.endpoint.host, r.endpoint.port))
            except OSError as exc:
                why = "already in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
                raise ConfigError("routes.endpoint", f"cannot listen on {r.endpoint}: {why}") from None
    if cfg.metrics_port:  # 0 picks a free port: nothing to check
        try:
            infos = socket.getaddrinfo(cfg.metrics_host, cfg.metrics_port, type=socket.SOCK_STREAM)
            family, _, _, _, addr = infos[0]
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the metrics server binds
                s.bind(addr)
        except OSError as exc:
            why = "already in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
            raise ConfigError("metrics.port", f"cannot listen on {cfg.metrics_host}:{cfg.metrics_port}: {why}") from None


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    logs.configure(args.log_level, json=args.log_json)
    hub_sockets: dict[str, socket.socket] = {}
    metrics_socket: socket.socket | None = None
    try:
        cfg = config_from_args(args)
        if args.worker_slot is not None:  # one of `--workers`' processes: its slice of the fleet (gateway/runtime/workers.py)
            from mavjet.gateway.runtime.workers import worker_setup

            cfg, hub_sockets, metrics_socket = worker_setup(cfg, args.worker_slot, os.environ)
        preflight(cfg)
        if args.worker_slot is None:  # a change of --workers must not strand spooled events or commands
            check_layout(cfg.state_dir, cfg.workers)
    except MavjetError as exc:
        print(redact(f"mavjet gateway: {exc}"), file=sys.stderr)
        return 2
    if not fastcrc_available():
        print("mavjet gateway: fastcrc is missing (MAVLink decoding would be 2x slower); "
              "reinstall mavjet with its dependencies", file=sys.stderr)
        return 2
    if cfg.workers > 1:  # the supervisor: starts the workers, serves one /metrics (gateway/runtime/workers.py)
        from mavjet.gateway.runtime.workers import supervise

        return supervise(cfg, argv)
    backend_options = {"use_uvloop": True} if cfg.uvloop else {}
    try:
        return anyio.run(
            partial(serve, cfg, commands=not args.no_commands, shadow=not args.no_shadow, hub_sockets=hub_sockets,
                    metrics_socket=metrics_socket),
            backend="asyncio", backend_options=backend_options,
        )
    except KeyboardInterrupt:
        return 0
    except ExceptionGroup as group:  # a ConfigError from inside the task group (the metrics port taken since preflight)
        rest = group.split(MavjetError)[1]
        if rest is not None:
            raise
        print(redact(f"mavjet gateway: {_first_leaf(group)}"), file=sys.stderr)
        return 2


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc
