"""`mavjet bench mixed` with the gateway as its own process, as it runs on an edge hub.

The in-process variant (`--in-process`) shares one event loop between the
gateway and the command issuer, so every result also waits behind the
gateway's own telemetry callbacks before the issuer sees it: a cost no
operator pays. Here the real `mavjet gateway` (commands on, shadow off) serves
the fleet in its own process, and this process only issues commands and runs
the baseline, each on its own NATS connection. State delivered is counted
from outside too: TWIN_STATE's sequence numbers over the window, and the
gateway's CPU from /proc.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from nats.aio.client import Client

from mavjet.benchmarks import cpuwait
from mavjet.benchmarks.commands import bare_roundtrip_at_rate, open_loop, summary
from mavjet.benchmarks.compare import ref_main
from mavjet.benchmarks.ingest import _proc_cpu_s
from mavjet.benchmarks.kit import percentile, sim_compiled_modules, this_python
from mavjet.benchmarks.scrape import OPENMETRICS, get_page_ms
from mavjet.benchmarks.workers import (
    _buckets,
    _family,
    _loadavg,
    _quantile_ms,
    _scrape,
    _state_seq,
    _total,
    links_up,
    log_tail,
    stop_gateway,
)
from mavjet.contract.natsconn import open_client
from mavjet.contract.subjects import CMD_STREAM
from mavjet.gateway.config import DEFAULT_RATES_HZ
from mavjet.ops.client import CommandClient
from mavjet.ops.compile import compiled_modules
from mavjet.ops.natsserver import NatsServer, free_port
from mavjet.ops.provision import DEFINITIONS_DIR, load_definitions, provision
from mavjet.sim.stepmode import in_step_from_env

ENV = "bench"
# `python -m mavjet.ops` of whichever build is first on the path (a --gateway-ref worktree's, or this one).
_GATEWAY_MAIN = "import sys; from mavjet.ops.cli import main; sys.exit(main(sys.argv[1:]))"
MODE = "STABILIZE"  # the sim accepts any mode while disarmed, as ArduCopter does: a harmless command


def _config(tmp: str, url: str, n: int, base: int, *, shaping: bool | None, uvloop: bool = False) -> Path:
    """The gateway's config; shaping None: no [uplink] table (a build from before the shaper refuses it)."""
    conf = Path(tmp) / "gateway-mixed.toml"
    lines = [f'env = "{ENV}"', 'instance = "bench"', f'state_dir = "{tmp}/state-mixed"',
             f"startup_timeout_s = {max(10.0, n / 20)}", *(["uvloop = true"] if uvloop else []),
             "[nats]", f'servers = ["{url}"]']
    if shaping is not None:
        lines += ["[uplink]", f"enabled = {'true' if shaping else 'false'}"]
    for i in range(n):
        lines += ["[[vehicles]]", f'vid = "VID-{i + 1:04d}"', f'endpoint = "tcp:127.0.0.1:{base + 10 * i}"']
    conf.write_text("\n".join(lines) + "\n")
    return conf


async def _wait_ready(proc: asyncio.subprocess.Process, url: str, port: int, n: int, timeout_s: float, *,
                      log_path: Path) -> float:
    """Every link up (the gateway's metrics) and every vehicle's commands pulled by a consumer; seconds taken."""
    nc = await open_client(url)
    js = nc.jetstream()
    started = time.monotonic()
    try:
        while True:  # bounded by timeout_s below
            await asyncio.sleep(1.0)
            if proc.returncode is not None:
                raise SystemExit(f"mavjet bench mixed: the gateway exited {proc.returncode}: {log_tail(log_path)}")
            up = await links_up(port)
            # Vehicles whose commands a consumer carries: one consumer per 500 vehicles (gateway/commands/intake.py),
            # or one each for a gateway of another build.
            consumers = len({f for c in await js.consumers_info(CMD_STREAM)
                             for f in (c.config.filter_subjects or [c.config.filter_subject or ""]) if f})
            if up >= n and consumers >= n:
                return time.monotonic() - started
            if time.monotonic() - started > timeout_s:
                raise SystemExit(f"mavjet bench mixed: {int(up)}/{n} links up, {consumers}/{n} vehicles' commands pulled "
                                 f"after {timeout_s:.0f} s; gateway warnings: {_log_events(log_path)}")
    finally:
        await nc.close()


def _published(mm: dict[str, list[tuple[dict[str, str], float]]]) -> float:
    return (_total(mm, "mavjet_publishes_total", kind="state", result="plain")
            + _total(mm, "mavjet_publishes_total", kind="state", result="acked"))


async def _wait_streaming(port: int, expected_per_s: float, timeout_s: float) -> float:
    """Until the state rate is steady: the sim boots for ~3 s before it streams (as ArduPilot does), and
    a window opened before every vehicle streams measures the start-up. Returns the last 2-s rate."""
    last, rate, started = _published(await asyncio.to_thread(_scrape, port)), 0.0, time.monotonic()
    prev = -1.0
    while time.monotonic() - started < timeout_s:  # bounded
        await asyncio.sleep(2.0)
        now = _published(await asyncio.to_thread(_scrape, port))
        rate, last = (now - last) / 2.0, now
        if rate >= 0.95 * expected_per_s or (rate > 0 and abs(rate - prev) <= 0.05 * rate):
            break
        prev = rate
    return rate


# The seeds of the Poisson schedules (`--arrivals poisson`): the same on both sides of a comparison.
COMMAND_SEED, BASELINE_SEED = 1, 2


def command_seed(args: argparse.Namespace) -> int | None:
    """The commands' Poisson seed, or None for even arrivals (`bench mixed --arrivals`)."""
    return COMMAND_SEED if getattr(args, "arrivals", "even") == "poisson" else None


async def with_baseline(commands: Awaitable[dict[str, Any]], url: str, rate_hz: float,
                        seconds: float, *, scrape: Callable[[], Awaitable[dict[str, Any]]] | None = None,
                        poisson: bool = False) -> dict[str, Any]:
    """The commands' figures and the bare JetStream round trip at the same rate, measured side by side
    (and the gateway's /metrics scraped meanwhile, if `scrape`)."""
    out: dict[str, Any] = {}

    async def cmds() -> None:
        out["commands"] = await commands

    async def bare() -> None:
        out["baseline_jetstream_roundtrip"] = await bare_roundtrip_at_rate(
            url, rate_hz, seconds, poisson_seed=BASELINE_SEED if poisson else None)

    async def scrapes() -> None:
        assert scrape is not None
        out["scrapes"] = await scrape()

    async with anyio.create_task_group() as tg:
        tg.start_soon(cmds)
        tg.start_soon(bare)
        if scrape is not None:
            tg.start_soon(scrapes)
    return out


async def scrape_every(port: int, every_s: float, seconds: float) -> dict[str, Any]:
    """GET /metrics every `every_s` for `seconds`, as Prometheus would: each scrape's wall time."""
    times: list[float] = []
    end = time.monotonic() + seconds
    for _ in range(int(seconds / every_s) + 1):  # bounded: one a period
        if time.monotonic() >= end:
            break
        t0 = time.monotonic()
        ms, _lines = await asyncio.to_thread(get_page_ms, f"http://127.0.0.1:{port}/metrics", OPENMETRICS, gz=False)
        times.append(ms)
        await asyncio.sleep(max(0.0, every_s - (time.monotonic() - t0)))
    return {"count": len(times), "every_s": every_s, "p50_ms": percentile(times, 0.5),
            "max_ms": round(max(times), 3) if times else None}


def _log_events(path: Path) -> dict[str, int]:
    """How often each warning or error event appeared in the gateway's JSON log (a disconnect, a timeout)."""
    counts: dict[str, int] = {}
    for line in path.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("level") in ("warning", "error"):
            key = str(rec.get("event"))
            counts[key] = counts.get(key, 0) + 1
    return counts


async def commands_at_rate(nc: Client, pick: Callable[[int], tuple[str, str]], rate_hz: float,
                           seconds: float, *, poisson_seed: int | None = None) -> dict[str, Any]:
    """`set_mode` at `rate_hz`, open loop, to `pick(i)` = (vid, mode); publish → cmd_result seen by the issuer."""
    lat: list[float] = []
    # Per command, split at the gateway's cmd_result stamp (its `latency_ms`: issued to result, one clock
    # here): up to the result, and from it to the issuer (the result's store and delivery).
    to_result: list[float] = []
    after_result: list[float] = []
    results: dict[str, int] = {}
    async with CommandClient(nc, ENV, issuer="bench-mixed") as cc:
        async def fire(i: int) -> None:
            vid, mode = pick(i)
            t0 = time.perf_counter()
            try:
                r = await cc.call(vid, "set_mode", {"mode": mode}, timeout_s=30)
                res = str(r.result)
            except Exception as exc:  # a lost result is a figure here, not a crash
                r, res = None, f"error:{type(exc).__name__}"
            took_ms = (time.perf_counter() - t0) * 1000.0
            lat.append(took_ms)
            if r is not None:
                to_result.append(r.latency_ms)
                after_result.append(max(0.0, took_ms - r.latency_ms))
            results[res] = results.get(res, 0) + 1

        wall = await open_loop(rate_hz, seconds, fire, poisson_seed=poisson_seed)
    out = summary(lat, len(lat), wall)
    out["results"] = results
    out["issued_to_result_ms"] = {"p50": percentile(to_result, 0.5), "p99": percentile(to_result, 0.99)}
    out["result_to_issuer_ms"] = {"p50": percentile(after_result, 0.5), "p99": percentile(after_result, 0.99)}
    return out


async def commands_from_outside(url: str, n: int, rate_hz: float, seconds: float, *,
                                poisson_seed: int | None = None) -> dict[str, Any]:
    """Vehicles in turn, on a connection of our own (as an operator's would be)."""
    nc = await open_client(url)
    try:
        return await commands_at_rate(nc, lambda i: (f"VID-{i % n + 1:04d}", MODE), rate_hz, seconds,
                                      poisson_seed=poisson_seed)
    finally:
        await nc.close()


async def run_process(args: argparse.Namespace, server: NatsServer, sim_pid: int, base: int, tmp: str) -> dict[str, Any]:
    n = args.vehicles
    nc = await open_client(server.url)
    await provision(nc.jetstream(), load_definitions(DEFINITIONS_DIR, env=ENV, replicas=1))
    await nc.close()
    port = free_port()
    # A gateway from another build (--gateway-ref): its own code first on the path, no shaper to configure.
    tree: Path | None = getattr(args, "gateway_tree", None)
    conf = _config(tmp, server.url, n, base, shaping=None if tree is not None else args.shaping,
                   uvloop=getattr(args, "uvloop", False))
    env = {**os.environ, "PYTHONPATH": str(tree)} if tree is not None else None
    with (Path(tmp) / "gateway-mixed.log").open("wb") as log_file:
        proc = await asyncio.create_subprocess_exec(
            *this_python(), "-c", _GATEWAY_MAIN if tree is None else ref_main(tree), "gateway", "--config", str(conf), "--metrics-port", str(port),
            "--no-shadow", "--log-level", "warning", "--log-json",
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log_file, env=env,
            cwd=str(tree) if tree is not None else None,
        )
    out: dict[str, Any] = {"vehicles": n, "cmd_rate_hz": args.cmd_rate, "duration_s": args.duration,
                           "gateway": "own process", "gateway_build": getattr(args, "gateway_build", "working tree"),
                           "gateway_uvloop": bool(getattr(args, "uvloop", False)),
                           # The gateway's process imports as this one does (its environment, mavjet compile),
                           # or the ref's tree, never compiled.
                           "hot_modules_compiled": 0 if tree is not None else sum(compiled_modules().values()),
                           "arrivals": getattr(args, "arrivals", "even")}
    try:
        took = await _wait_ready(proc, server.url, port, n, max(120.0, n / 5), log_path=Path(tmp) / "gateway-mixed.log")
        print(f"gateway ready: {n} links and command consumers in {took:.1f} s; measuring {args.duration:g} s "
              f"at {args.cmd_rate:g} cmd/s once state streams", flush=True)
        expected = n * sum(DEFAULT_RATES_HZ.values())
        rate = await _wait_streaming(port, expected, max(60.0, n / 20))
        print(f"streaming: {rate:.0f} state/s of {expected:.0f}; warm-up {args.warmup:g} s", flush=True)
        await asyncio.sleep(args.warmup)
        pids = _family(proc.pid)
        out["loadavg_before"] = _loadavg()
        m0 = await asyncio.to_thread(_scrape, port)
        seq0, cpu0 = await _state_seq(server.url), [_proc_cpu_s(p) for p in pids]
        sim0 = _proc_cpu_s(sim_pid)
        waits = {"gateway": pids, "sim": [sim_pid], "nats": [server.proc.pid] if server.proc else []}
        wait0 = cpuwait.snapshot(waits)
        t0 = time.monotonic()
        every: float = getattr(args, "scrape_every", 0.0)
        seed = command_seed(args)
        out.update(await with_baseline(commands_from_outside(server.url, n, args.cmd_rate, args.duration,
                                                             poisson_seed=seed),
                                       server.url, args.cmd_rate, args.duration,
                                       scrape=(lambda: scrape_every(port, every, args.duration)) if every else None,
                                       poisson=seed is not None))
        wall = time.monotonic() - t0
        wait1 = cpuwait.snapshot(waits)
        seq1 = await _state_seq(server.url)
        m1 = await asyncio.to_thread(_scrape, port)
        cpu = sum(_proc_cpu_s(p) - c for p, c in zip(pids, cpu0, strict=True))
        out["loadavg_after"] = _loadavg()
        out["state_stored_per_s"] = round((seq1 - seq0) / wall, 1)
        out["state_expected_per_s"] = round(expected, 1)
        out["state_delivered_ratio"] = round((seq1 - seq0) / wall / expected, 3)
        out["gateway_cpu_pct"] = round(100 * cpu / wall, 1)
        out["sim_cpu_pct"] = round(100 * (_proc_cpu_s(sim_pid) - sim0) / wall, 1)
        out["sim_in_step"] = in_step_from_env()
        out["sim_modules_compiled"] = sim_compiled_modules(sim_pid)
        out["nats_gomaxprocs"] = server.go_max_procs
        # Time each process was ready and had no core (benchmarks/cpuwait.py): each hop of a command may wait so.
        out.update(cpuwait.report(wait0, wait1))
        def delta(name: str, **match: str) -> float:
            return _total(m1, name, **match) - _total(m0, name, **match)

        out["state_published_per_s"] = round((_published(m1) - _published(m0)) / wall, 1)
        out["state_dropped_per_s"] = round(delta("mavjet_publishes_total", kind="state", result="dropped") / wall, 1)
        out["mavlink_msgs_per_s"] = round(delta("mavjet_mavlink_messages_total") / wall, 1)
        # What the uplink shaper (on by default, as deployed) held back, and its level at the end.
        out["uplink_shed_per_s"] = round(delta("mavjet_uplink_shed_total") / wall, 1)
        out["uplink_level_end"] = _total(m1, "mavjet_uplink_level")
        # Where a command's time goes, from the gateway's own histograms (bucket bounds): delivery to its
        # cmd_result inside the gateway, and an event's spool to JetStream ack (cmd_result is an event).
        for key, name, match in (("gateway_command_ms", "mavjet_command_duration_seconds", {"command": "set_mode"}),
                                 ("gateway_event_publish_ms", "mavjet_publish_latency_seconds", {"kind": "event"}),
                                 ("gateway_state_publish_ms", "mavjet_publish_latency_seconds", {"kind": "state"}),
                                 # how late its event loop ran a due timer: the wait each hop may add
                                 ("gateway_loop_lag_ms", "mavjet_event_loop_lag_seconds", {}),
                                 # ... and the command's time by phase: before the gateway (queue), then in it
                                 # (absent in older builds)
                                 *((f"gateway_phase_{ph}_ms", "mavjet_command_phase_seconds", {"phase": ph})
                                   for ph in ("queue", "ledger", "vehicle", "result"))):
            b0, b1 = _buckets(m0, name, **match), _buckets(m1, name, **match)
            out[key] = {"p50_le": _quantile_ms(b0, b1, 0.5), "p99_le": _quantile_ms(b0, b1, 0.99)}
    finally:
        await stop_gateway(proc)
    out["gateway_warnings"] = _log_events(Path(tmp) / "gateway-mixed.log")
    cmd, bare_rt = out.get("commands", {}), out.get("baseline_jetstream_roundtrip", {})
    if cmd.get("p99_ms") and bare_rt.get("p99_ms"):
        out["ratio_latency_p50"] = round(cmd["p50_ms"] / bare_rt["p50_ms"], 2)
        out["ratio_latency_p99"] = round(cmd["p99_ms"] / bare_rt["p99_ms"], 2)
    return out
