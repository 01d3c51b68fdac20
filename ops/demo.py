"""`mavjet demo`: everything on one machine, shown live.

Starts an embedded nats-server with JetStream, provisions the twin resources,
starts simulated vehicles and the gateway as child processes, then shows the
fleet table and event feed. The vehicles fly a sortie: through TWIN_CMD when
the command executor is installed, otherwise the simulator's own autopilot.
Ctrl-C (or --duration) stops every process it started.

`--secure` (`make demo-secure`) runs the same demo with the permission matrix
of docs/security.md: `mavjet auth init` writes DIR/auth, the server runs with
its auth.conf, provisioning uses admin.creds, the gateway its own gateway
credential (for the demo's vehicles only), the sortie operator.creds and the
fleet view viewer.creds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from nats.aio.client import Client

from mavjet.contract import natsconn
from mavjet.contract.errors import ConfigError
from mavjet.contract.natsconn import NatsOptions, connect_kwargs, open_client
from mavjet.contract.units import parse_duration_s
from mavjet.ops import auth
from mavjet.ops.fleet import show
from mavjet.ops.natsserver import COLOCATED_GOMAXPROCS, DEV_CONFIG, NatsServer, free_port
from mavjet.ops.provision import DEFINITIONS_DIR, load_definitions, provision
from mavjet.ops.runner import run_cli
from mavjet.ops.sortie import fly_sortie_forever

ENV = "prod"
DEMO_GATEWAY = "demo-gw"  # the gateway's identity under --secure
SIM_START_ATTEMPTS = 3
SIM_READY_TIMEOUT_S = 15.0  # the simulator imports pymavlink and binds: ~1 s idle, more under load


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As the simulator's listeners bind (asyncio's servers reuse addresses): a port whose
        # only users are connections in TIME_WAIT is free for them.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def pick_base_port(n: int, preferred: int = 5760, *, is_free: Callable[[int], bool] = _port_free) -> int:
    """A base port such that base + 10*i is free for every vehicle (SITL's layout)."""
    # Large fleets (4,000 vehicles span 40,000 ports) fit only from a low base, and then cross the
    # ephemeral range, where a port in use ends in any digit: low bases with each last digit.
    low = [start + digit for start in (20000, 2000) for digit in (1, 3, 7, 9, 5)]
    candidates = ([preferred] if preferred else []) + [free_port() for _ in range(20)] + low
    for base in candidates:
        if base + 10 * n < 65535 and all(is_free(base + 10 * i) for i in range(n)):
            return base
    raise RuntimeError("no free port range for the simulated vehicles")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mavjet demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vehicles", type=int, default=3, help="simulated vehicles (default: %(default)s)")
    p.add_argument("--speedup", type=float, default=1.0, help="simulation speed-up (default: %(default)s)")
    p.add_argument("--flavour", choices=["ardupilot", "px4"], default="ardupilot",
                   help="the autopilot the simulated vehicles behave like (default: %(default)s)")
    p.add_argument("--duration", help="stop after this long, e.g. 60s (default: until Ctrl-C)")
    p.add_argument("--dir", type=Path, default=Path(".mavjet/demo"), help="data and logs (default: %(default)s)")
    p.add_argument("--sortie", choices=["auto", "commands", "sim"], default="auto",
                   help="who flies the sortie: the gateway through TWIN_CMD, or the sim's own autopilot")
    p.add_argument("--no-clear", action="store_true", help="append frames instead of redrawing the screen")
    p.add_argument("--secure", action="store_true",
                   help="with per-identity credentials and the permission matrix (docs/security.md)")
    p.add_argument("--report", type=Path, metavar="OUT",
                   help="no demo: serve the last demo's data (DIR/js) and replay its audit trail into OUT "
                        "(report.html; needs the analytics extra and Java: `make report`)")
    return p


REPORT_SINCE = "30d"  # the whole of a demo's audit trail (TWIN_EVENTS keeps 90 days)


def report(args: argparse.Namespace) -> int:
    """`mavjet demo --report OUT`: `mavjet replay` of the stored demo, with a nats-server started for it."""
    store = args.dir / "js"
    if not store.is_dir():
        raise ConfigError("--report", f"no demo data in {store}: run `make demo` first (or `mavjet replay "
                          "--nats URL --out DIR` against a server of your own)")
    server = NatsServer(store_dir=str(store), log_file=str(args.dir / "nats-report.log"),
                        gomaxprocs=COLOCATED_GOMAXPROCS)
    server.start()
    try:
        print(f"nats-server {server.url} serving the demo's data in {store}", flush=True)
        rc = subprocess.call([sys.executable, "-m", "mavjet.ops", "replay", "--since", REPORT_SINCE,
                              "--out", str(args.report), "--nats", server.url, "--env", ENV])
    finally:
        server.stop()
    if rc == 0:
        print(f"report: {args.report / 'report.html'}")
    return rc


def _use_commands(choice: str) -> bool:
    return choice in ("commands", "auto")


async def _connect(url: str, creds: Path | None) -> Client:
    opts = NatsOptions(servers=(url,), creds_file=None if creds is None else str(creds))
    return await open_client(**connect_kwargs(opts))


async def _run(args: argparse.Namespace, url: str, vids: list[str], via_commands: bool,
               creds: Path | None = None) -> None:
    """Provision, fly, show; under --secure each with its own identity from `creds` (DIR/auth/creds)."""
    admin = await _connect(url, creds and creds / "admin.creds")
    try:
        await provision(admin.jetstream(), load_definitions(DEFINITIONS_DIR, env=ENV, replicas=1))
    finally:
        if creds is not None:
            await admin.close()
    operator = admin if creds is None else await _connect(url, creds / "operator.creds")
    viewer = admin if creds is None else await _connect(url, creds / "viewer.creds")
    try:
        tasks = []
        if via_commands:
            for i, vid in enumerate(vids):
                tasks.append(asyncio.create_task(fly_sortie_forever(operator, ENV, vid, index=i), name=f"demo.sortie[{vid}]"))
        duration = parse_duration_s(args.duration) if args.duration else None
        try:
            await show(viewer, ENV, refresh_s=1.0, duration_s=duration, clear=not args.no_clear and sys.stdout.isatty(),
                       url=url)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        for nc in {id(c): c for c in (admin, operator, viewer)}.values():
            await natsconn.close(nc)  # at a Ctrl-C the server may have gone first


def _stop(proc: subprocess.Popen[bytes] | None, name: str) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        # After Ctrl-C the children got SIGINT too and are already shutting down.
        proc.wait(timeout=2)
        return
    except subprocess.TimeoutExpired:
        pass
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        print(f"mavjet demo: {name} did not stop on SIGTERM; killing it", file=sys.stderr)
        proc.kill()
        proc.wait(timeout=5)


def _start_sim(
    args: argparse.Namespace, exe: list[str], log: Path, via_commands: bool
) -> tuple[subprocess.Popen[bytes], int]:
    """Start the simulator and wait until it says its vehicles listen.

    The base port is only known to be free when it is picked; another program
    can take it before the simulator binds. Then the simulator exits with
    "address already in use" and a new base is tried (a few times)."""
    for attempt in range(SIM_START_ATTEMPTS):
        base = pick_base_port(args.vehicles, preferred=5760 if attempt == 0 else 0)
        cmd = [*exe, "sim", "--vehicles", str(args.vehicles), "--base-port", str(base),
               "--speedup", str(args.speedup), "--flavour", args.flavour]
        if not via_commands:
            cmd.append("--sortie")
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + SIM_READY_TIMEOUT_S
        while proc.poll() is None and time.monotonic() < deadline:
            if b"ready vehicles=" in log.read_bytes():
                return proc, base
            time.sleep(0.1)
        if proc.poll() is None or b"address already in use" not in log.read_bytes():
            return proc, base  # running (slow start) or a failure that another port will not fix
    return proc, base


def _exited(name: str, proc: subprocess.Popen[bytes], log: Path) -> int:
    print(f"mavjet demo: {name} exited with {proc.returncode}; see {log}", file=sys.stderr)
    return 1


def main(argv: list[str]) -> int:
    return run_cli(build_parser(), run, argv)


def run(args: argparse.Namespace) -> int:
    if args.report is not None:
        return report(args)
    if not 1 <= args.vehicles <= 200:
        raise ConfigError("--vehicles", "must be 1..200")
    if not (math.isfinite(args.speedup) and 0 < args.speedup <= 1000):  # the simulator's own bound, said up front
        raise ConfigError("--speedup", f"must be in (0, 1000], got {args.speedup}")
    via_commands = _use_commands(args.sortie)
    data = args.dir
    shutil.rmtree(data / "js", ignore_errors=True)
    shutil.rmtree(data / "state", ignore_errors=True)
    data.mkdir(parents=True, exist_ok=True)
    vids = [f"VID-{i + 1:03d}" for i in range(args.vehicles)]
    creds: Path | None = None
    config: str | None = None
    if args.secure:
        # A fresh identity set each run, like the fresh store: nothing from a previous demo is trusted.
        auth.init(data / "auth", env=ENV, vehicles=vids, gateways={DEMO_GATEWAY: vids}, force=True)
        creds = data / "auth" / "creds"
        (data / "nats.conf").write_text(DEV_CONFIG + "include auth/auth.conf\n")
        config = str(data / "nats.conf")
    server = NatsServer(store_dir=str(data / "js"), log_file=str(data / "nats.log"), config_file=config,
                        gomaxprocs=COLOCATED_GOMAXPROCS)
    sim: subprocess.Popen[bytes] | None = None
    gw: subprocess.Popen[bytes] | None = None
    try:
        server.start()
        exe = [sys.executable, "-m", "mavjet.ops"]
        sim, base = _start_sim(args, exe, data / "sim.log", via_commands)
        if sim.poll() is not None:
            return _exited("simulator", sim, data / "sim.log")
        metrics_port = free_port()
        gw_cmd = [*exe, "gateway", "--nats", server.url, "--env", ENV, "--state-dir", str(data / "state"),
                  "--metrics-port", str(metrics_port), "--instance", "demo", "--log-json"]
        if creds is not None:
            gw_cmd += ["--creds", str(creds / f"{DEMO_GATEWAY}.creds")]
        for i, vid in enumerate(vids):
            gw_cmd += ["--vehicle", f"{vid}=tcp:127.0.0.1:{base + 10 * i}"]
        with open(data / "gateway.log", "wb") as gw_log:
            gw = subprocess.Popen(gw_cmd, stdout=gw_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        print(f"nats-server {server.url} (JetStream, data in {data / 'js'})")
        print(f"{args.vehicles} simulated vehicles on tcp 127.0.0.1:{base}+10*i, gateway metrics on "
              f"http://127.0.0.1:{metrics_port}/metrics, logs in {data}/")
        print(f"sortie flown by {'the gateway through TWIN_CMD' if via_commands else 'the simulator'}")
        hint = "" if creds is None else f" --creds {creds / 'viewer.creds'}"
        if creds is not None:
            print(f"secured: credentials in {creds}/ (docs/security.md); anonymous clients are refused")
        print(f"try in another shell: mavjet twin VID-001 --nats {server.url}{hint}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_run(args, server.url, vids, via_commands, creds))
    finally:
        _stop(gw, "gateway")
        _stop(sim, "simulator")
        server.stop()
    for name, proc in (("gateway", gw), ("simulator", sim)):
        if proc is not None and proc.returncode not in (0, None):
            print(f"mavjet demo: {name} exited with {proc.returncode}; see {data}/{'sim' if name == 'simulator' else name}.log",
                  file=sys.stderr)
            return 1
    print("demo stopped: nats-server, simulator and gateway are down")
    return 0
