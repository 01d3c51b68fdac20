"""`mavjet bench ingest --workers 1,2,4`: the gateway as processes, 1 vs N workers, one sim and one server.

Each worker count runs the real `mavjet gateway` (`--workers N` for N > 1,
the single-process daemon for 1) against the same simulator and nats-server,
one after the other, so the scaling ratio compares runs of one session. What
is measured comes from outside the gateway: its /metrics (one endpoint, the
supervisor's, for every worker), JetStream's own sequence numbers for what was
stored, and /proc for the CPU of every process involved (gateway processes,
nats-server, simulator) and the load average beside each figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from mavjet.benchmarks.ingest import OrderCheck, _proc_cpu_s
from mavjet.benchmarks.kit import default_json, nats_and_sim, report, this_python
from mavjet.contract.natsconn import open_client
from mavjet.gateway.config import DEFAULT_RATES_HZ
from mavjet.gateway.runtime import logs
from mavjet.ops.natsserver import NatsServer, free_port
from mavjet.ops.provision import DEFINITIONS_DIR, load_definitions, provision

ENV = "bench"


def _scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def _total(mm: dict[str, list[tuple[dict[str, str], float]]], name: str, **match: str) -> float:
    return sum(v for labels, v in mm.get(name, []) if all(labels.get(k) == x for k, x in match.items()))


def _buckets(mm: dict[str, list[tuple[dict[str, str], float]]], name: str, **match: str) -> dict[float, float]:
    """A histogram's cumulative buckets (le -> count), summed over the series matching `match` (all without)."""
    out: dict[float, float] = {}
    for labels, v in mm.get(name + "_bucket", []):
        if all(labels.get(k) == x for k, x in match.items()):
            le = float(labels["le"])
            out[le] = out.get(le, 0.0) + v
    return out


def _quantile_ms(b0: dict[float, float], b1: dict[float, float], q: float) -> float | None:
    """The bucket bound (ms) under which a fraction q of the window's observations fell."""
    delta = sorted((le, b1.get(le, 0.0) - b0.get(le, 0.0)) for le in b1)
    if not delta or delta[-1][1] <= 0:
        return None
    for le, n in delta:
        if n >= q * delta[-1][1]:
            return le * 1000
    return None


def log_tail(path: Path, lines: int = 3) -> str:
    """The last lines the gateway wrote (its one-line error when it failed at start), for a message."""
    try:
        tail = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()][-lines:]
    except OSError as e:
        return f"(its log {path} could not be read: {e})"
    return " | ".join(tail) if tail else "(it wrote nothing)"


async def stop_gateway(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM (the gateway drains and closes), SIGKILL after 60 s; nothing for one that already exited.

    A gateway that failed at start has exited before the caller's `finally`
    gets here: signalling it would raise ProcessLookupError over the error
    that says why it failed.
    """
    if proc.returncode is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
    except ProcessLookupError:  # it exited between the check and the signal
        await proc.wait()
        return
    try:
        async with asyncio.timeout(60):
            await proc.wait()
    except TimeoutError:
        proc.kill()
        await proc.wait()


async def links_up(port: int) -> float:
    """Links up, as the gateway's own /metrics says (0 while it does not answer yet)."""
    try:
        return _total(await asyncio.to_thread(_scrape, port), "mavjet_link_up")
    except OSError:
        return 0.0


def _family(root: int) -> list[int]:
    """The gateway's processes: the supervisor (or single daemon) and its children."""
    pids = [root]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == root:
                        pids.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return pids


def _loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


async def _state_seq(url: str) -> int:
    nc = await open_client(url)
    try:
        info = await nc.jetstream().stream_info("TWIN_STATE")
        return int(info.state.last_seq)
    finally:
        await nc.close()


@dataclass(frozen=True, slots=True, kw_only=True)
class Rig:
    server: NatsServer
    sim_pid: int
    base: int
    tmp: str


async def run_one(args: argparse.Namespace, workers: int, rig: Rig) -> dict[str, Any]:
    server, sim_pid, base, tmp = rig.server, rig.sim_pid, rig.base, rig.tmp
    n = args.vehicles
    conf = Path(tmp) / f"gateway-{workers}.toml"
    lines = [f'env = "{ENV}"', 'instance = "bench"', f'state_dir = "{tmp}/state-{workers}"',
             f"startup_timeout_s = {max(10.0, n / 20)}", f"uvloop = {'true' if args.uvloop else 'false'}",
             f"workers = {workers}", "[nats]", f'servers = ["{server.url}"]']
    for i in range(n):
        lines += ["[[vehicles]]", f'vid = "VID-{i + 1:04d}"', f'endpoint = "tcp:127.0.0.1:{base + 10 * i}"']
    conf.write_text("\n".join(lines) + "\n")
    port = free_port()
    log_path = Path(tmp) / f"gateway-{workers}.log"
    with log_path.open("wb") as log_file:
        proc = await asyncio.create_subprocess_exec(
            *this_python(), "-m", "mavjet.ops", "gateway", "--config", str(conf), "--metrics-port", str(port),
            "--no-commands", "--no-shadow", "--log-level", "warning",
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log_file,
        )
    try:
        started = time.monotonic()
        while True:  # every link up, as the gateway's own metrics say
            await asyncio.sleep(1.0)
            if proc.returncode is not None:
                raise SystemExit(f"mavjet bench: the {workers}-worker gateway exited {proc.returncode}: "
                                 f"{log_tail(log_path)}")
            up = await links_up(port)
            if up >= n or time.monotonic() - started > 300:
                break
        print(f"workers={workers}: {int(up)}/{n} links up in {time.monotonic() - started:.1f} s; "
              f"warm-up {args.warmup:g} s, measuring {args.duration:g} s", flush=True)
        await asyncio.sleep(args.warmup)
        order = OrderCheck()
        watcher = await open_client(server.url)
        for i in range(min(n, 10)):
            await watcher.subscribe(f"fleet.{ENV}.veh.VID-{i + 1:04d}.state.>", cb=order.on_msg)
        pids = _family(proc.pid)
        load0 = _loadavg()
        m0, seq0 = await asyncio.to_thread(_scrape, port), await _state_seq(server.url)
        cpu0 = [_proc_cpu_s(p) for p in pids]
        nats0, sim0 = _proc_cpu_s(server.proc.pid) if server.proc else 0.0, _proc_cpu_s(sim_pid)
        t0 = time.monotonic()
        await asyncio.sleep(args.duration)
        wall = time.monotonic() - t0
        cpu = sum(_proc_cpu_s(p) - c for p, c in zip(pids, cpu0, strict=True))
        nats_cpu = (_proc_cpu_s(server.proc.pid) if server.proc else 0.0) - nats0
        sim_cpu = _proc_cpu_s(sim_pid) - sim0
        m1, seq1 = await asyncio.to_thread(_scrape, port), await _state_seq(server.url)
        load1 = _loadavg()
        await watcher.drain()
    finally:
        await stop_gateway(proc)

    def delta(name: str, **match: str) -> float:
        return _total(m1, name, **match) - _total(m0, name, **match)

    msgs = delta("mavjet_mavlink_messages_total")
    published = delta("mavjet_publishes_total", kind="state", result="plain") + \
        delta("mavjet_publishes_total", kind="state", result="acked")
    expected = n * sum(DEFAULT_RATES_HZ.values())
    latency = "mavjet_publish_latency_seconds"
    b0, b1 = _buckets(m0, latency, kind="state"), _buckets(m1, latency, kind="state")
    return {
        "workers": workers, "gateway_processes": len(pids), "duration_s": round(wall, 2),
        "loadavg_before": load0, "loadavg_after": load1,
        "state_msgs_per_s": round(published / wall, 1),
        "state_stored_per_s": round((seq1 - seq0) / wall, 1),
        "state_expected_per_s": round(expected, 1),
        "state_delivered_pct": round(100 * (seq1 - seq0) / wall / expected, 1),
        "mavlink_msgs_per_s": round(msgs / wall, 1),
        "state_dropped": int(delta("mavjet_publishes_total", kind="state", result="dropped")),
        "latency_ms_p50_le": _quantile_ms(b0, b1, 0.50),
        "latency_ms_p99_le": _quantile_ms(b0, b1, 0.99),
        "gateway_cpu_pct": round(100 * cpu / wall, 1),
        "gateway_cpu_us_per_mavlink_msg": round(cpu / max(1.0, msgs) * 1e6, 2),
        "nats_cpu_pct": round(100 * nats_cpu / wall, 1),
        "sim_cpu_pct": round(100 * sim_cpu / wall, 1),
        "links_up": int(_total(m1, "mavjet_link_up")),
        "order_checked_samples": order.checked,
        "order_reordered_samples": order.reordered,
    }


async def run_all(args: argparse.Namespace, counts: list[int], rig: Rig) -> dict[str, Any]:
    nc = await open_client(rig.server.url)
    await provision(nc.jetstream(), load_definitions(DEFINITIONS_DIR, env=ENV, replicas=1))
    await nc.close()
    # Rounds alternate the order (1,2,4 then 4,2,1): a machine whose load drifts during the run
    # then favours no worker count.
    order = [w for r in range(max(1, args.rounds)) for w in (counts if r % 2 == 0 else counts[::-1])]
    runs: list[dict[str, Any]] = []
    for w in order:
        runs.append(await run_one(args, w, rig))
        print(json.dumps(runs[-1]), flush=True)  # each run as it ends: a long run shows progress

    def mean(w: int, key: str) -> float:
        vals = [float(r[key]) for r in runs if r["workers"] == w]
        return sum(vals) / len(vals)

    base = counts[0]
    return {
        "vehicles": args.vehicles, "cores": os.cpu_count(), "rounds": max(1, args.rounds), "runs": runs,
        "mean_state_stored_per_s": {str(w): round(mean(w, "state_stored_per_s"), 1) for w in counts},
        "mean_gateway_cpu_us_per_mavlink_msg": {str(w): round(mean(w, "gateway_cpu_us_per_mavlink_msg"), 2)
                                                for w in counts},
        f"scaling_state_rate_vs_{base}": {
            str(w): round(mean(w, "state_stored_per_s") / max(1.0, mean(base, "state_stored_per_s")), 3) for w in counts},
        f"scaling_cpu_per_msg_vs_{base}": {
            str(w): round(mean(w, "gateway_cpu_us_per_mavlink_msg") /
                          max(1e-9, mean(base, "gateway_cpu_us_per_mavlink_msg")), 3) for w in counts},
    }


def run_workers(args: argparse.Namespace) -> int:
    """`mavjet bench ingest --workers 1,2,4 ...` (benchmarks/ingest.py hands over here)."""
    try:
        counts = [int(x) for x in str(args.workers).split(",") if x.strip()]
    except ValueError:
        print(f"mavjet bench ingest: --workers {args.workers!r}: expected counts like 1,2,4", file=sys.stderr)
        return 2
    if not counts or any(not 1 <= c <= 32 for c in counts):
        print("mavjet bench ingest: --workers: counts in [1, 32]", file=sys.stderr)
        return 2
    logs.configure("warning")
    # Below the ephemeral range and away from `bench ingest`'s 25760, which may run beside it.
    with nats_and_sim(args.vehicles, preferred_port=6000) as (server, sim, base, tmp):
        res = asyncio.run(run_all(args, counts, Rig(server=server, sim_pid=sim.pid, base=base, tmp=tmp)))
    out = args.json or default_json(f"workers-{args.vehicles}")
    report({k: v for k, v in res.items() if k != "runs"}, out)
    out.write_text(json.dumps(res, indent=2))
    bad = sum(r["order_reordered_samples"] for r in res["runs"])
    if bad:
        print(f"mavjet bench ingest: {bad} state samples arrived out of order", flush=True)
        return 1
    return 0
