"""`mavjet bench`: benchmarks that print figures and write JSON.

Every benchmark measures its own baseline in the same run and reports the
ratio, because these machines are shared and absolute numbers drift.
`ingest` lives here; `commands`, `shadow` and `replay` live beside the code
they measure.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import math
import os
import resource
import subprocess
import time
from pathlib import Path
from typing import Any

import anyio
import msgpack

from mavjet.benchmarks import cpuwait
from mavjet.benchmarks.kit import (
    cpu_hogs,
    default_json,
    nats_and_sim,
    non_negative_float,
    non_negative_int,
    percentile,
    positive_float,
    positive_int,
    process_rss_mib,
    report,
    sim_compiled_modules,
)
from mavjet.contract.envelope import unpack
from mavjet.contract.natsconn import NatsOptions, open_client
from mavjet.contract.subjects import EVENTS_STREAM
from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.drivers.mavlink.transport import Endpoint
from mavjet.gateway.config import GatewayConfig, VehicleConfig
from mavjet.gateway.daemon import Gateway
from mavjet.gateway.entry import tune_process
from mavjet.gateway.publish.uplink import UplinkConfig
from mavjet.gateway.runtime import logs
from mavjet.ops.compile import compiled_modules
from mavjet.ops.natsserver import NatsServer
from mavjet.ops.provision import DEFINITIONS_DIR, load_definitions, provision
from mavjet.sim.stepmode import in_step_from_env


def _rss_mib() -> float:
    rss = process_rss_mib(os.getpid())
    return rss if not math.isnan(rss) else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # no /proc


def _proc_cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError):
        return float("nan")


async def capture_bytes(host: str, port: int, seconds: float) -> bytes:
    """Record what a vehicle sends once its streams are requested (the ceiling's input)."""
    from mavjet.drivers.mavlink.codec import MavCodec

    r, w = await asyncio.open_connection(host, port)
    enc = MavCodec()
    for name, hz in (("GLOBAL_POSITION_INT", 10), ("ATTITUDE", 10), ("SYS_STATUS", 1), ("GPS_RAW_INT", 1),
                     ("VFR_HUD", 2), ("BATTERY_STATUS", 1), ("EXTENDED_SYS_STATE", 1), ("SYSTEM_TIME", 1)):
        w.write(enc.encode(mavlink2.MAVLink_command_long_message(
            1, 1, mavlink2.MAV_CMD_SET_MESSAGE_INTERVAL, 0, getattr(mavlink2, f"MAVLINK_MSG_ID_{name}"),
            int(1e6 / hz), 0, 0, 0, 0, 0)))
    await w.drain()
    buf = bytearray()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            async with asyncio.timeout(max(0.01, end - time.monotonic())):
                buf += await r.read(65536)
        except TimeoutError:
            break
    w.close()
    return bytes(buf)


async def ceiling(url: str, sample: bytes, seconds: float) -> dict[str, float]:
    """The bare loop: pymavlink parse + dict + msgpack + publish_async, nothing else."""
    mav = mavlink2.MAVLink(None, 245, 191)
    mav.robust_parsing = True
    nc = await open_client(url)
    js = nc.jetstream(publish_async_max_pending=4000)
    n = 0
    cpu0, t0 = time.process_time(), time.monotonic()
    while time.monotonic() - t0 < seconds:
        for msg in mav.parse_buffer(sample) or ():
            if msg.get_type() == "BAD_DATA":
                continue
            payload = msgpack.packb({"v": 1, "vid": "BASE", "time": msgpack.Timestamp.from_unix_nano(time.time_ns()),
                                     "data": msg.to_dict()})
            await js.publish_async("fleet.bench.veh.BASE.state.raw", payload)
            n += 1
    await js.publish_async_completed()
    wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
    await nc.close()
    return {"msgs": n, "msgs_per_s": n / wall, "cpu_us_per_msg": cpu / max(1, n) * 1e6}


class GcTimer:
    """CPU seconds the cyclic garbage collector took while installed (gc.callbacks), by generation."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.collections = [0, 0, 0]
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.process_time()
        else:
            gen = info["generation"]
            self.seconds[gen] += time.process_time() - self._t0
            self.collections[gen] += 1

    def __enter__(self) -> GcTimer:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


class OrderCheck:
    """Per state subject, is every sample's `time` at or after the previous one's?

    Subscribes (core NATS, no JetStream cost) to a few vehicles' state subjects
    while the benchmark measures: ~24 messages/s a vehicle, well under 1% of the
    gateway's work at the sizes measured.
    """

    def __init__(self) -> None:
        self.last_ns: dict[str, int] = {}
        self.checked = 0
        self.reordered = 0

    async def on_msg(self, msg: Any) -> None:
        t = unpack(msg.data).time_ns
        prev = self.last_ns.get(msg.subject)
        if prev is not None and t < prev:
            self.reordered += 1
        self.last_ns[msg.subject] = t
        self.checked += 1


async def run_ingest(
    args: argparse.Namespace, server: NatsServer, sim: subprocess.Popen[bytes], base: int, tmp: str
) -> dict[str, Any]:
    nc = await open_client(server.url)
    await provision(nc.jetstream(), load_definitions(DEFINITIONS_DIR, env="bench", replicas=1))
    await nc.close()
    n = args.vehicles
    # Wait for the last listener (the extra vehicle that feeds the ceiling's sample).
    for _ in range(600):
        try:
            _, w = await asyncio.open_connection("127.0.0.1", base + 10 * n)
            w.close()
            break
        except OSError:
            await asyncio.sleep(0.1)
    sample = await capture_bytes("127.0.0.1", base + 10 * n, 3.0)
    cfg = GatewayConfig(
        vehicles=tuple(VehicleConfig(vid=f"VID-{i + 1:04d}", endpoint=Endpoint.parse(f"tcp:127.0.0.1:{base + 10 * i}"))
                       for i in range(n)),
        nats=NatsOptions(servers=(server.url,)), env="bench", instance="bench",
        state_dir=Path(tmp) / "state", startup_timeout_s=max(10.0, n / 20), uvloop=args.uvloop,
        # The shaper (gateway/publish/uplink.py) sheds state when the machine, not the uplink, is
        # slow; this benchmark measures the cost of the configured rates, so it is off
        # unless asked for.
        uplink=UplinkConfig(enabled=args.shaping),
    )
    gw = Gateway(cfg)
    result: dict[str, Any] = {}

    async def measure() -> None:
        await gw.ready.wait()
        tune_process()  # as the daemon's process entry does
        await anyio.sleep(args.warmup)
        sessions = [t.session for t in gw.twins.values()]
        m0 = sum(s.health().messages_in for s in sessions)
        p0 = gw.publisher.state_published
        # Samples the link-adaptive shaper held back (gateway/publish/uplink.py; absent in older builds):
        # a comparison of CPU per message is only fair at the same state rate.
        shaper = getattr(gw.publisher, "uplink", None)
        shed0 = getattr(shaper, "shed", 0)
        twins = list(gw.twins.values())
        superseded0 = sum(t.superseded for t in twins)
        latencies_ns: list[int] = []
        gw.publisher.on_state_ack = latencies_ns.append
        order = OrderCheck()
        watcher = await open_client(server.url)
        for i in range(min(n, 10)):
            await watcher.subscribe(f"fleet.bench.veh.VID-{i + 1:04d}.state.>", cb=order.on_msg)
        passes0, ready0 = _reactor_counts()
        waits = {"gateway": [os.getpid()], "sim": [sim.pid], "nats": [server.proc.pid] if server.proc else []}
        wait0 = cpuwait.snapshot(waits)
        cpu0, t0, sys0 = time.process_time(), time.monotonic(), os.times().system
        simcpu0 = _proc_cpu_s(sim.pid)
        with GcTimer() as gct:
            await anyio.sleep(args.duration)
        wall = time.monotonic() - t0
        wait1 = cpuwait.snapshot(waits)
        cpu = time.process_time() - cpu0
        sys_s = os.times().system - sys0
        simcpu = _proc_cpu_s(sim.pid) - simcpu0
        passes1, ready1 = _reactor_counts()
        passes, ready = passes1 - passes0, ready1 - ready0
        msgs = sum(s.health().messages_in for s in sessions) - m0
        pubs = gw.publisher.state_published - p0
        gw.publisher.on_state_ack = None
        await watcher.drain()
        lat = list(latencies_ns)
        expected = n * sum(cfg.rates_hz.values()) * wall
        result.update({
            "vehicles": n, "duration_s": round(wall, 2), "event_loop": "uvloop" if args.uvloop else "asyncio",
            "sim_in_step": in_step_from_env(),
            # The simulator's compiled modules (mavjet compile --sim): it shares the cores with the gateway.
            "sim_modules_compiled": sim_compiled_modules(sim.pid),
            # How many of the hot modules ran compiled (mavjet compile): 0 is the interpreted gateway.
            "hot_modules_compiled": sum(compiled_modules().values()),
            "nats_gomaxprocs": server.go_max_procs,  # the Go runtime's threads for nats-server
            "mavlink_msgs_per_s": round(msgs / wall, 1),
            "state_msgs_per_s": round(pubs / wall, 1),
            "state_expected_per_s": round(expected / wall, 1),
            "sustained": pubs >= 0.95 * expected,
            "latency_ms_p50": percentile(lat, 0.50, scale=1e-6),
            "latency_ms_p99": percentile(lat, 0.99, scale=1e-6),
            "gateway_cpu_pct": round(100 * cpu / wall, 1),
            "gateway_cpu_us_per_mavlink_msg": round(cpu / max(1, msgs) * 1e6, 2),
            # Of that, the kernel's (socket reads and their ACKs, writes to the server): the part
            # that grows most in a slow hour (docs/benchmarks.md) and that no Python change shortens.
            "gateway_cpu_sys_pct": round(100 * sys_s / wall, 1),
            "gateway_sys_us_per_mavlink_msg": round(sys_s / max(1, msgs) * 1e6, 2),
            "sim_cpu_pct": round(100 * simcpu / wall, 1),
            # The fleet's epoll (drivers/mavlink/reactor.py; absent in older builds): how
            # often the loop ran it, and how many ready sockets each run read.
            "reactor_passes_per_s": round(passes / wall, 1),
            "reads_per_reactor_pass": round(ready / max(1, passes), 2),
            # Part of the gateway's CPU: the cyclic collector, per generation (young, middle, full).
            "gc_cpu_pct": [round(100 * x / wall, 2) for x in gct.seconds],
            "gc_collections": gct.collections,
            "gateway_rss_mib": round(_rss_mib(), 1),
            "links_up": sum(1 for s in sessions if s.is_up),
            "state_dropped": gw.publisher.state_dropped,
            "state_shed": getattr(shaper, "shed", 0) - shed0,
            # Replaced by a newer sample before their publish turn: what a gateway that
            # cannot keep up sheds (and the rate decimation of a vehicle sending faster).
            "state_superseded": sum(t.superseded for t in twins) - superseded0,
            "order_checked_samples": order.checked,
            "order_reordered_samples": order.reordered,
        })
        # How long the gateway's loop, the simulator and nats-server waited for a CPU (benchmarks/cpuwait.py):
        # what tells a slow hour's figures from the code's.
        result.update(cpuwait.report(wait0, wait1))
        result.update(await _events_and_connection(gw, server.url))
        gw.request_stop("bench done")

    async with anyio.create_task_group() as tg:
        tg.start_soon(measure)
        await gw.run()
    base_fig = await ceiling(server.url, sample, args.baseline_seconds)
    result["ceiling"] = {k: round(v, 2) for k, v in base_fig.items()}
    result["ratio_throughput"] = round(result["mavlink_msgs_per_s"] / base_fig["msgs_per_s"], 3)
    result["ratio_cpu_efficiency"] = round(base_fig["cpu_us_per_msg"] / max(1e-9, result["gateway_cpu_us_per_mavlink_msg"]), 3)
    return result


def _reactor_counts() -> tuple[int, int]:
    """This loop's fleet epoll: (passes, ready sockets read); zeros if the build has none (older refs)."""
    try:
        from mavjet.drivers.mavlink.reactor import Reactor
    except ImportError:
        return 0, 0
    # `existing`, not `for_loop`: looking must not make an epoll for a loop without links.
    existing = getattr(Reactor, "existing", None)  # older refs: no such method, no count
    reactor = existing(asyncio.get_running_loop()) if existing is not None else None
    return getattr(reactor, "passes", 0), getattr(reactor, "ready_seen", 0)


async def _events_and_connection(gw: Gateway, url: str, drain_s: float = 20.0) -> dict[str, Any]:
    """Overload's other promises (issue 15, goal 5): no event lost, the NATS connection kept.

    Every event the gateway handed to its spool since it started, against what
    TWIN_EVENTS holds once the spool has drained (bounded wait).
    """
    pub = gw.publisher
    for _ in range(int(drain_s / 0.1)):
        if not pub.events_waiting:
            break
        await anyio.sleep(0.1)
    nc = await open_client(url)
    try:
        stored = (await nc.jetstream().stream_info(EVENTS_STREAM)).state.messages
    finally:
        await nc.close()
    enqueued = pub.events_enqueued
    reconnects = pub.nc.stats["reconnects"] if pub.nc is not None else None
    return {"events_enqueued": enqueued, "events_stored": stored, "events_lost": max(0, enqueued - stored),
            "nats_reconnects": reconnects, "nats_connected_at_end": bool(pub.nc is not None and pub.nc.is_connected)}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mavjet bench ingest",
                                description="sim + gateway + nats-server on this machine; MAVLink in, JetStream state out.")
    p.add_argument("--vehicles", type=positive_int, default=10, help="simulated vehicles the gateway serves (default %(default)s)")
    p.add_argument("--duration", type=positive_float, default=10.0, help="measurement window, seconds")
    p.add_argument("--warmup", type=non_negative_float, default=3.0, help="seconds after startup before measuring")
    p.add_argument("--baseline-seconds", type=positive_float, default=3.0,
                   help="seconds of the same-run ceiling: a bare pymavlink parse + msgpack + publish loop (default %(default)s)")
    p.add_argument("--uvloop", action="store_true", help="run the gateway on uvloop")
    p.add_argument("--shaping", action="store_true",
                   help="let the uplink shaper shed state (off: every configured sample is published)")
    p.add_argument("--workers", metavar="N[,N...]", help="run `mavjet gateway --workers N` as processes for each N, "
                   "one after the other against one sim and server, and print the scaling (benchmarks/workers.py)")
    p.add_argument("--json", type=Path, default=None, help="write results here "
                   "(default: benchmarks/results/ingest-N-STAMP.json in a checkout, docs/benchmarks.md)")
    p.add_argument("--compare", metavar="REF", help="run this benchmark from git REF and from the working tree "
                   "alternately and print both with their ratio (mavjet bench compare)")
    p.add_argument("--rounds", type=positive_int, default=2, help="with --compare: runs of each side (default %(default)s)")
    p.add_argument("--new-uvloop", action="store_true", help="with --compare: the working tree's side on uvloop, "
                   "the ref's on asyncio (each edge hub as deployed; deploy/edge-hub/gateway.toml)")
    p.add_argument("--new-compiled", action="store_true", help="with --compare: the working tree's side with its "
                   "hot path compiled by mypyc (mavjet compile), as a deployment that compiles it runs")
    p.add_argument("--ref-compiled", action="store_true", help="with --compare: the ref's side compiled too, by "
                   "its own mavjet compile (with --new-compiled: compiled code against compiled code)")
    p.add_argument("--sim-compiled", action="store_true", help="with --compare: both sides' simulator with its "
                   "tick path compiled (mavjet compile --sim), the same on both sides")
    p.add_argument("--cpu-hog", type=non_negative_int, default=0, metavar="K",
                   help="K busy processes load the machine while it runs (overload on a loaded machine)")
    return p


def ingest_main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.workers:
        from mavjet.benchmarks.workers import run_workers

        return run_workers(args)
    if args.compare:
        from mavjet.benchmarks.compare import compare

        # The same benchmark options for both sides; --json names the comparison's own file.
        rest = ["--vehicles", str(args.vehicles), "--duration", str(args.duration), "--warmup", str(args.warmup),
                "--baseline-seconds", str(args.baseline_seconds), *(["--uvloop"] if args.uvloop else []),
                *(["--shaping"] if args.shaping else [])]  # a ref without a shaper refuses --shaping
        return compare(args.compare, "ingest", rest, rounds=args.rounds, out=args.json, cpu_hog=args.cpu_hog,
                       new_args=["--uvloop"] if args.new_uvloop and not args.uvloop else [],
                       new_compiled=args.new_compiled, ref_compiled=args.ref_compiled,
                       sim_compiled=args.sim_compiled)
    logs.configure("warning")
    backend_options = {"use_uvloop": True} if args.uvloop else {}
    # One vehicle more than the gateway serves: the ceiling's sample is recorded from it.
    with cpu_hogs(args.cpu_hog), nats_and_sim(args.vehicles + 1, preferred_port=25760) as (server, sim, base, tmp):
        res = anyio.run(run_ingest, args, server, sim, base, tmp, backend="asyncio", backend_options=backend_options)
    report(res, args.json or default_json(f"ingest-{args.vehicles}"))
    if res.get("order_reordered_samples"):
        print(f"mavjet bench ingest: {res['order_reordered_samples']} state samples arrived out of order", flush=True)
        return 1
    return 0



def main(argv: list[str]) -> int:
    return ingest_main(argv)
