"""`mavjet gateway`: the daemon.

One supervising task group owns every task, each named after what it serves
(`vehicle[VID-001].link`, `nats.spool_drainer`, ...). Startup waits (bounded)
until each link has heard its vehicle, then tells systemd READY. SIGTERM or
SIGINT stops intake, records `gateway_stopped`, drains the spool and NATS, and
closes the links; the process exits 0.
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
import time
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import structlog
from anyio.abc import TaskGroup

from drivers.mavlink.dialect import fastcrc_available
from drivers.mavlink.udphub import UdpHub
from gateway import logs
from gateway.clock import GatewayClock
from gateway.config import GatewayConfig, load_toml, resolve_config
from gateway.contract import natsconn
from gateway.contract.errors import ConfigError, MavjetError
from gateway.contract.redact import redact
from gateway.layout import check_layout
from gateway.metrics import GatewayMetrics
from gateway.publisher import Publisher
from gateway.recorder import TrackRecorder
from gateway.samples import ReadyStates, StateSample
from gateway.services import Foreground, GatewayService, ServiceContext
from gateway.spool import Spool
from gateway.vehicle import VehicleTwin

log = structlog.get_logger("mavjet.gateway")
# The longest the fleet-wide state tick holds the event loop before it yields (see `_ticker`):
# while a command runs, and otherwise.
TICK_STEP_S = 0.003
TICK_IDLE_STEP_S = 0.020
# Overload: when the rest of the loop (reading MAVLink) holds it longer than a step between two
# steps, the idle step grows to match, up to this: state gets as much of the loop as reading, not
# 20 ms of every pass of hundreds. 4,000 vehicles on 2 cores (knee 2,000): 32.6k → 42.2k state/s
# stored, p99 1.16 → 1.52 s (each hop of a sample through the loop waits for a longer pass).
TICK_MAX_IDLE_STEP_S = 0.100
# Queued samples published per buffer write (~1 µs each), with a yield between steps as for the twins.
READY_CHUNK = 256


class _StepBudget:
    """The idle step's length, carried from tick to tick: the last gap between two steps, bounded."""

    __slots__ = ("idle_s",)

    def __init__(self) -> None:
        self.idle_s = TICK_IDLE_STEP_S

    def after_gap(self, gap_s: float) -> None:
        self.idle_s = min(TICK_MAX_IDLE_STEP_S, max(TICK_IDLE_STEP_S, gap_s))


class _TickSteps:
    """The tick's clock: `over(i)` once the step's time is spent (looked at every 16 vehicles), `next()` yields."""

    __slots__ = ("_budget", "_end", "_foreground")

    def __init__(self, foreground: Foreground, budget: _StepBudget) -> None:
        self._foreground = foreground
        self._budget = budget
        self._end = 0.0
        self.start()

    def start(self) -> None:
        self._end = time.perf_counter() + (TICK_STEP_S if self._foreground.active else self._budget.idle_s)

    def over(self, i: int) -> bool:
        return i & 15 == 15 and self.spent()

    def spent(self) -> bool:
        return time.perf_counter() >= self._end

    async def next(self) -> None:
        yielded = time.perf_counter()
        await anyio.lowlevel.checkpoint()
        self._budget.after_gap(time.perf_counter() - yielded)
        self.start()


class Gateway:
    """The daemon as an object, so tests and benchmarks can run it in-process."""

    def __init__(self, cfg: GatewayConfig, *, hub_sockets: Mapping[str, socket.socket] | None = None,
                 metrics_socket: socket.socket | None = None) -> None:
        self.cfg = cfg
        self.metrics = GatewayMetrics()
        self._metrics_socket = metrics_socket
        self.spool = Spool(cfg.state_dir / "spool.sqlite", max_entries=cfg.spool_max_events)
        self.publisher = Publisher(cfg, self.spool, self.metrics)
        # A udp: vehicle with a sysid listens through a hub socket, one per
        # port, demultiplexed by sysid (GatewayConfig makes every vehicle on a
        # shared port such a vehicle).
        self.hubs: dict[str, UdpHub] = {}
        for v in cfg.vehicles:
            if v.endpoint.scheme == "udp" and v.sysid is not None and str(v.endpoint) not in self.hubs:
                # `hub_sockets`: a worker's share of a port its parent bound (gateway/workers.py).
                self.hubs[str(v.endpoint)] = UdpHub(v.endpoint, bound=(hub_sockets or {}).get(str(v.endpoint)))
        # Samples due when they arrived, queued by the twins for the next tick (the common case), and
        # twins holding a sample not yet due: the ticker publishes the first and visits only these.
        self._ready = ReadyStates()
        self._dirty: set[VehicleTwin] = set()
        # The one clock of every state sample and event time (gateway/clock.py).
        self.clock = GatewayClock()
        self.twins = {
            v.vid: VehicleTwin(v, cfg, self.publisher, self.metrics, hub=self.hubs.get(str(v.endpoint)),
                               on_fresh=self._dirty.add, ready=self._ready, clock=self.clock)
            for v in cfg.vehicles
        }
        self.metrics.watch_sessions(lambda: [t.session for t in self.twins.values()])
        self.metrics.watch_superseded(lambda: sum(t.superseded for t in self.twins.values()))
        self.metrics.watch_signing(lambda: [(t.vid, t.link.codec.stats.signing_rejected) for t in self.twins.values()])
        self.metrics_port: int | None = None
        self.ready = anyio.Event()
        self.stopping = anyio.Event()
        self._stop_reason = "stopped"
        self._notifier: Any = None
        # Commands, shadow: started once the links are, cancelled at shutdown.
        self.services: list[GatewayService] = []
        self.context = ServiceContext(cfg=cfg, vehicles=self.twins, nats=self.publisher, metrics=self.metrics,
                                      bulk=self.publisher.uplink)
        self._add_routes()
        if cfg.track_hz > 0:  # the flight recorder (gateway/recorder.py): TWIN_TRACKS while armed
            self.services.append(TrackRecorder(cfg))

    def _add_routes(self) -> None:
        """Ground stations through the gateway (gateway/routes.py): `--route` endpoints and the NATS tunnel."""
        from gateway.routes import RouteService, TunnelService

        taps = {vid: t.link for vid, t in self.twins.items()}
        locks = {vid: t.session.transfer_lock for vid, t in self.twins.items()}
        hubs: list[Any] = []
        if self.cfg.routes:
            routes = RouteService(self.cfg.routes, taps=taps, locks=locks)
            self.services.append(routes)
            hubs.append(routes.hubs)
        tunnelled = tuple(v.vid for v in self.cfg.vehicles if self.cfg.tunnel_for(v))
        if tunnelled:
            tunnel = TunnelService(tunnelled, taps=taps, locks=locks)
            self.services.append(tunnel)
            hubs.append(tunnel.hubs)
        if hubs:
            self.metrics.watch_routes(lambda: [(vid, name, st) for by_vid in hubs for vid, hub in by_vid.items()
                                               for name, st in list(hub.stats.items())])

    def request_stop(self, reason: str = "stopped") -> None:
        self._stop_reason = reason
        self.stopping.set()

    async def _ticker(self) -> None:
        """One wake-up per tick for the whole fleet: publish what is fresh and due.

        A tick's work is cut into steps, each published and followed by a yield, so a command's
        delivery, its vehicle's ACK and its result do not wait behind a whole tick of state (the
        link channel of every vehicle at once, or the backlog of a loop that fell behind). Steps are
        `TICK_STEP_S` while a command runs (`ServiceContext.foreground`), else `TICK_IDLE_STEP_S`
        (up to `TICK_MAX_IDLE_STEP_S` while reading holds the loop longer, `_StepBudget`): every
        yield is another pass over the fleet's sockets, and at 2,000 vehicles 3 ms steps all the
        time cost a fifth of the state rate (44.6k → 35.0k samples/s). Order per channel holds:
        one task publishes, the queued samples (`ReadyStates`) before the twins' later ones.
        """
        twins = list(self.twins.values())
        dirty = self._dirty
        link_hz = self.cfg.rates_hz.get("link")
        link_every_ns = int(1e9 / link_hz) if link_hz else None
        clock = self.clock
        next_link_ns = clock.now_ns()
        tick_gauge = self.metrics.loop_tick
        publish_states = self.publisher.publish_states
        foreground = self.context.foreground
        budget = _StepBudget()
        ready = self._ready
        while True:
            now_ns = clock.now_ns()
            tick_gauge.set(now_ns / 1e9)
            if ready.items:
                # Before the twins' rate-limited samples: each of those is newer than its
                # channel's queued one (a channel is queued or waiting, never both).
                queued = ready.take()
                steps = _TickSteps(foreground, budget)
                for start in range(0, len(queued), READY_CHUNK):
                    await publish_states(queued[start:start + READY_CHUNK])
                    if steps.spent():
                        await steps.next()
            if dirty:
                batch = list(dirty)
                dirty.clear()
                due: list[StateSample] = []
                steps = _TickSteps(foreground, budget)
                for i, twin in enumerate(batch):
                    try:
                        if twin.collect_due(now_ns, due):
                            dirty.add(twin)
                    except Exception:  # one vehicle's bad state must not stop the others' publishing
                        twin.fresh.clear()
                        twin.report_error("publish")
                    if steps.over(i):
                        if due:
                            await publish_states(due)  # one buffer write per step
                            due = []
                        await steps.next()
                if due:
                    await publish_states(due)
            if link_every_ns is not None and now_ns >= next_link_ns:
                next_link_ns = max(next_link_ns + link_every_ns, now_ns)
                links: list[StateSample] = []
                steps = _TickSteps(foreground, budget)
                for i, twin in enumerate(twins):
                    try:
                        twin.collect_link(now_ns, links)
                    except Exception:
                        twin.report_error("publish")
                    if steps.over(i):
                        if links:
                            await publish_states(links)
                            links = []
                        await steps.next()
                if links:
                    await publish_states(links)
            await anyio.sleep(self.cfg.publish_tick_s)

    async def _watchdog(self) -> None:
        n = self._notifier
        interval = getattr(n, "watchdog_interval_s", None)
        if not interval:
            return
        while True:
            n.watchdog()
            await anyio.sleep(interval)

    async def _startup(self) -> None:
        with anyio.move_on_after(self.cfg.startup_timeout_s):
            async with anyio.create_task_group() as tg:
                for twin in self.twins.values():
                    tg.start_soon(twin.session.wait_ready, name=f"vehicle[{twin.vid}].wait_ready")
        not_up = [t.vid for t in self.twins.values() if not t.session.is_up]
        if not_up:
            log.warning("startup_links_not_ready", vehicles=not_up, waited_s=self.cfg.startup_timeout_s)
        log.info("gateway_ready", vehicles=len(self.twins), nats=self.publisher.is_connected,
                 metrics_port=self.metrics_port)
        self.ready.set()
        if self._notifier is not None:
            self._notifier.ready()

    async def run(self) -> None:
        """Run until `request_stop()` (or cancellation); then shut down cleanly."""
        if self._metrics_socket is not None:  # a `--workers` worker: the supervisor's socket (gateway/workers.py)
            self.metrics_port = self.metrics.serve_on(self._metrics_socket)
        elif self.cfg.metrics_port is not None:
            self.metrics_port = self.metrics.serve(self.cfg.metrics_host, self.cfg.metrics_port)
        try:
            from gateway.sdnotify import Notifier

            self._notifier = Notifier.from_env(os.environ)
        except ImportError:
            self._notifier = None
        try:
            async with anyio.create_task_group() as root:
                await root.start(self.publisher.run, name="nats.publisher")
                async with anyio.create_task_group() as intake:
                    for twin in self.twins.values():
                        await intake.start(twin.run, name=f"vehicle[{twin.vid}].link")
                    intake.start_soon(self._ticker, name="gateway.state_ticker")
                    intake.start_soon(self._watchdog, name="gateway.watchdog")
                    # start_soon, not start: startup must not wait for a service
                    # (a service waiting for NATS would hold the links' readiness).
                    for svc in self.services:
                        intake.start_soon(svc.run, self.context, name=f"gateway.{type(svc).__name__}")
                    await self._startup()
                    await self.stopping.wait()
                    for twin in self.twins.values():
                        twin.closing = True
                    intake.cancel_scope.cancel()  # stop intake: links, ticker, commands
                with anyio.CancelScope(shield=True):
                    await self._shutdown(root)
        finally:
            for hub in self.hubs.values():
                hub.close()
            self.spool.close()

    async def _shutdown(self, root: TaskGroup) -> None:
        if self._notifier is not None:
            self._notifier.stopping()
        log.info("gateway_stopping", reason=self._stop_reason)
        now_ns = self.clock.now_ns()
        for twin in self.twins.values():
            twin.flush_suppressed(now_ns, flush=True)  # what the budget held back is reported before we go
            twin.emit("gateway_stopped", gateway=self.cfg.instance, reason=self._stop_reason)
        await self.publisher.shutdown(self.cfg.shutdown_timeout_s)
        root.cancel_scope.cancel()
        log.info("gateway_stopped", spooled=self.spool.depth)


def with_services(gw: Gateway, *, commands: bool = True, shadow: bool = True) -> Gateway:
    """Add the command executor (TWIN_CMD) and the shadow reconciler (TWIN_SHADOW)."""
    if commands:
        from gateway.commands.consumer import CommandService
        from gateway.commands.logs import LogDownloadService

        gw.services.extend([CommandService(), LogDownloadService()])
    if shadow:
        from gateway.shadow.service import ShadowService

        gw.services.append(ShadowService(gw.cfg.shadow))
    return gw


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
    p.add_argument("--route", action="append", default=[], metavar="ENDPOINT",
                   help="a ground station's endpoint (repeatable): udp:HOST:PORT (listen), udpout:HOST:PORT, "
                   "tcp:HOST:PORT (server); options ?vid=VID&sysid=N,N&compid=N (docs/companion.md)")
    p.add_argument("--config", type=Path, help="TOML config file (see deploy/gateway.example.toml)")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port (0 = any free port)")
    p.add_argument("--metrics-host", help="address for the metrics endpoint (default 127.0.0.1)")
    p.add_argument("--state-dir", type=Path, help="where the spool and ledgers live (default .mavjet/state)")
    p.add_argument("--instance", help="gateway instance name in events and logs (default: hostname)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--log-json", action="store_true", default=None, help="JSON logs even on a TTY")
    p.add_argument("--uvloop", action="store_true", default=None, help="use uvloop (edge hubs with many vehicles)")
    p.add_argument("--track-hz", type=float, metavar="HZ",
                   help="flight recorder: position samples per second to TWIN_TRACKS while armed "
                   "(default 1; 0 = off; env MAVJET_TRACK_HZ)")
    p.add_argument("--workers", type=int, metavar="N",
                   help="run N processes that split the vehicles, one metrics endpoint (default 1; env MAVJET_WORKERS; "
                   "docs/deploy.md)")
    p.add_argument("--worker-slot", metavar="I/N", help=argparse.SUPPRESS)  # set by --workers for its processes
    p.add_argument("--no-commands", action="store_true", help="telemetry only: do not consume TWIN_CMD")
    p.add_argument("--no-shadow", action="store_true", help="do not reconcile TWIN_SHADOW desired documents")
    return p


def config_from_args(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> GatewayConfig:
    """flag > environment > file > default, resolved in `gateway.config.resolve_config`."""
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
        if args.worker_slot is not None:  # one of `--workers`' processes: its slice of the fleet (gateway/workers.py)
            from gateway.workers import worker_setup

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
    if cfg.workers > 1:  # the supervisor: starts the workers, serves one /metrics (gateway/workers.py)
        from gateway.workers import supervise

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
