"""`mavjet bench scale --counts 100,1000,10000`: one command consumer per gateway against one per vehicle.

For each fleet size N and each design, on a fresh nats-server provisioned
with the real TWIN_CMD and TWIN_EVENTS, the gateway's own intake code
(`gateway/commands/intake.py`, `lane.py`) serves N vehicles' command
subjects:

- `vehicle`: today's design until this change, a durable `gw_<vid>` per
  vehicle (MaxAckPending 1), N intakes through one API limiter;
- `gateway`: one durable consumer per 500 vehicles, each with their filter subjects
  (`gateway_intakes`: a consumer's create time grows with the square of its filters).

The vehicles are light: each lane's executor acks the command and publishes
its `cmd_result` (msg id and all) without a MAVLink link, because 2 cores
cannot fly 10,000 `sim/` vehicles and the question is the server side (the
full path with sim vehicles is `mavjet bench commands`). Per trial it
measures the server's RSS growth and consumer count, the time until every
vehicle is bound, the command round trip publish → `cmd_result` received
(open loop at `--rate`, to random vehicles), and the re-bind after a restart:
the intakes are cancelled as a killed process's would be (no clean-up) and a
new set starts (a new process name in the gateway design, which takes the
subjects over from the dead consumer).

Trials are interleaved (each round runs every N in both designs, the order
of the designs alternating) and figures are the medians over rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import msgpack
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from mavjet.benchmarks.kit import (
    default_json,
    percentile,
    positive_float,
    positive_int,
    positive_ints,
    process_rss_mib,
    report,
)
from mavjet.contract.events import EventType
from mavjet.contract.natsconn import open_client
from mavjet.contract.subjects import CMD_STREAM, EVENTS_STREAM, cmd_subject, event_subject
from mavjet.drivers.mavlink.transport import Endpoint
from mavjet.gateway.commands.delivery import CommandDelivery
from mavjet.gateway.commands.executor import Disposition
from mavjet.gateway.commands.intake import API_CONCURRENCY, Intake, gateway_intakes
from mavjet.gateway.commands.keepalive import KeepAlives
from mavjet.gateway.commands.lane import VehicleLane
from mavjet.gateway.config import CommandsConfig, GatewayConfig, VehicleConfig
from mavjet.gateway.entry import tune_process
from mavjet.gateway.runtime.metrics import GatewayMetrics
from mavjet.gateway.services import ServiceContext
from mavjet.ops.natsserver import NatsServer
from mavjet.ops.provision import DEFINITIONS_DIR, load_definitions, provision

ENV = "bench"
DESIGNS = ("vehicle", "gateway")


class _Nats:
    """The gateway's `NatsAccess` over one plain connection (no spool: results are published at once)."""

    def __init__(self, nc: Client) -> None:
        self.nc: Client | None = nc
        self.js: JetStreamContext | None = nc.jetstream(timeout=30)
        self.connected = anyio.Event()
        self.connected.set()

    @property
    def is_connected(self) -> bool:
        return self.nc is not None and self.nc.is_connected

    def enqueue_event(self, subject: str, msg_id: str, payload: bytes) -> None:
        raise NotImplementedError("the light executor publishes at once")

    async def flush_pending_to_spool(self) -> None:
        return None

    async def publish_event_now(self, subject: str, msg_id: str, payload: bytes) -> bool:
        assert self.js is not None
        await self.js.publish(subject, payload, headers={"Nats-Msg-Id": msg_id})
        return True


class _Vehicle:
    def __init__(self, vid: str) -> None:
        self.vid = vid

    def may_act(self) -> bool:
        return True


class _LightExecutor:
    """Acks a command and publishes its result, as the real executor ends an accepted one (no MAVLink)."""

    def __init__(self, vid: str, nats: _Nats) -> None:
        self.vid = vid
        self.nats = nats
        self.subject = event_subject(ENV, vid, EventType.CMD_RESULT)

    async def handle(self, msg: CommandDelivery) -> Disposition:
        cmd_id = (msg.headers or {}).get("Nats-Msg-Id", "")
        body = msgpack.packb({"cmd_id": cmd_id, "result": "accepted"})
        await self.nats.publish_event_now(self.subject, f"{cmd_id}:cmd_result", body)
        await msg.ack_sync(5.0)
        return Disposition.ACK

    async def hand_back(self, msg: CommandDelivery, why: str) -> Disposition:
        await msg.hand_back()
        return Disposition.HANDED_BACK

    async def refuse(self, msg: CommandDelivery, detail: str) -> Disposition | None:
        return None


def _context(nats: _Nats, *, holder: str) -> ServiceContext:
    cfg = GatewayConfig(vehicles=(VehicleConfig(vid="V0", endpoint=Endpoint.parse("udp:127.0.0.1:14550")),),
                        env=ENV, instance="bench")
    return ServiceContext(cfg=cfg, vehicles={}, nats=nats, metrics=GatewayMetrics(), holder=holder)


def _intakes(design: str, ctx: ServiceContext, lanes: dict[str, VehicleLane], api: anyio.CapacityLimiter,
             name: str) -> list[Intake]:
    if design == "vehicle":
        return [Intake(ctx, lanes, name=f"gw_{vid}", vids=(vid,), max_ack_pending=1, inactive_s=None, api=api)
                for vid in lanes]
    return gateway_intakes(ctx, lanes, base_name=name, api=api, max_ack_pending=ctx.cfg.commands.max_ack_pending)


def _all_bound(intakes: Sequence[Intake], n: int) -> bool:
    return sum(len(i.bound) for i in intakes) == n


async def _serve(design: str, nats: _Nats, vids: list[str], name: str, *, task_status: Any) -> None:
    """One gateway's command side for `vids` until cancelled (a kill: nothing deleted)."""
    cfg = CommandsConfig()
    keepalives = KeepAlives(1.0)
    lanes = {vid: VehicleLane(_Vehicle(vid), _LightExecutor(vid, nats), keepalives, max_queued=cfg.max_queued_per_vehicle)
             for vid in vids}
    ctx = _context(nats, holder=name)
    intakes = _intakes(design, ctx, lanes, anyio.CapacityLimiter(API_CONCURRENCY), name)
    t0 = time.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(keepalives.run)
        for lane in lanes.values():
            tg.start_soon(lane.run)
        for intake in intakes:
            tg.start_soon(intake.run)
        while not _all_bound(intakes, len(vids)):  # noqa: ASYNC110 - polls the intakes' state, bounded by the trial
            await anyio.sleep(0.005)
        bound_s = time.monotonic() - t0
        tune_process()  # as the gateway's process is once ready (GC out of the way of a large fleet's objects)
        task_status.started(bound_s)


@asynccontextmanager
async def _killable_gateway(url: str, design: str, vids: list[str], name: str) -> AsyncIterator[float]:
    """A gateway's command side on its own connection, yielding the time it took to bind; killed at the end."""
    nc = await open_client(url)
    try:
        async with anyio.create_task_group() as tg:
            bound_s: float = await tg.start(_serve, design, _Nats(nc), vids, name)
            try:
                yield bound_s
            finally:
                tg.cancel_scope.cancel()  # killed: its consumers stay as they were, for the next one to take
    finally:
        await nc.close()


async def _round_trips(nc: Client, js: JetStreamContext, vids: list[str], *, count: int, rate_hz: float,
                       rng: random.Random) -> tuple[list[float], int]:
    """`count` commands to random vehicles at `rate_hz`; the round trip of each, ms, and how many came back."""
    sent: dict[str, float] = {}
    lat: list[float] = []
    done = anyio.Event()

    async def on_result(msg: Msg) -> None:
        cmd_id = msgpack.unpackb(msg.data).get("cmd_id", "")
        t = sent.pop(cmd_id, None)
        if t is not None:
            lat.append((time.perf_counter() - t) * 1000.0)
            if len(lat) == count:
                done.set()

    sub = await nc.subscribe(f"fleet.{ENV}.veh.*.evt.{EventType.CMD_RESULT}", cb=on_result)
    await nc.flush()
    period = 1.0 / rate_hz
    start = time.perf_counter()
    for k in range(count):
        vid = rng.choice(vids)
        cmd_id = f"{vid}:{k}-{rng.getrandbits(32):08x}"
        await anyio.sleep(max(0.0, start + k * period - time.perf_counter()))
        sent[cmd_id] = time.perf_counter()
        await js.publish(cmd_subject(ENV, vid, "noop"), b"\x80", headers={"Nats-Msg-Id": cmd_id})
    with anyio.move_on_after(30):
        await done.wait()
    await sub.unsubscribe()
    return lat, len(lat)


async def trial(design: str, n: int, *, commands: int, rate_hz: float, seed: int) -> dict[str, Any]:
    tmp = tempfile.TemporaryDirectory(prefix="mavjet-bench-scale-")
    server = NatsServer(store_dir=f"{tmp.name}/js")
    server.start()
    assert server.proc is not None
    vids = [f"V{i:05d}" for i in range(n)]
    rng = random.Random(seed)
    try:
        nc = await open_client(server.url)
        js = nc.jetstream(timeout=30)
        defs = [d for d in load_definitions(DEFINITIONS_DIR, env=ENV, replicas=1, size="small")
                if d.name in (CMD_STREAM, EVENTS_STREAM)]
        await provision(js, defs)
        rss0 = process_rss_mib(server.proc.pid)
        out: dict[str, Any] = {"design": design, "vehicles": n}
        async with _killable_gateway(server.url, design, vids, "gwx_bench_first") as bind_s:
            out["bind_s"] = round(bind_s, 3)
            await anyio.sleep(1.0)  # let the server settle before reading its memory
            out["server_rss_mib"] = round(process_rss_mib(server.proc.pid) - rss0, 1)
            out["consumers"] = (await js.stream_info(CMD_STREAM)).state.consumer_count
            lat, got = await _round_trips(nc, js, vids, count=commands, rate_hz=rate_hz, rng=rng)
            out.update(commands=commands, results=got, p50_ms=percentile(lat, 0.5), p99_ms=percentile(lat, 0.99))
        async with _killable_gateway(server.url, design, vids, "gwx_bench_second") as rebind_s:
            out["rebind_s"] = round(rebind_s, 3)
            small = min(commands, 50)
            _, got = await _round_trips(nc, js, vids, count=small, rate_hz=rate_hz, rng=rng)
            out["served_after_restart"] = f"{got}/{small}"
            out["consumers_after_restart"] = (await js.stream_info(CMD_STREAM)).state.consumer_count
        await nc.close()
        return out
    finally:
        server.cleanup()
        tmp.cleanup()


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if isinstance(r.get(key), int | float)]
    return round(statistics.median(values), 3) if values else None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mavjet bench scale", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--counts", type=positive_ints, default="100,1000,10000",
                   help="fleet sizes, comma separated (default %(default)s)")
    p.add_argument("--rounds", type=positive_int, default=3, help="trials per size and design, interleaved "
                   "(default %(default)s); figures are medians")
    p.add_argument("--commands", type=positive_int, default=400, help="commands per trial (default %(default)s)")
    p.add_argument("--rate", type=positive_float, default=100.0, help="commands per second (default %(default)s)")
    p.add_argument("--vehicle-max", type=positive_int, default=10000,
                   help="largest fleet run in the per-vehicle design (creating 50,000 consumers takes minutes)")
    p.add_argument("--json", type=Path, default=None, help="write results here "
                   "(default: benchmarks/results/scale-STAMP.json in a checkout, docs/benchmarks.md)")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    # A line per consumer created would bury the figures (10,000 of them in the per-vehicle design).
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    counts: list[int] = args.counts
    trials: dict[str, list[dict[str, Any]]] = {}
    for r in range(args.rounds):
        for n in counts:
            designs = DESIGNS if r % 2 == 0 else tuple(reversed(DESIGNS))
            for design in designs:
                if design == "vehicle" and n > args.vehicle_max:
                    continue
                print(f"round {r + 1}: {design} x {n} ...", flush=True)
                row = asyncio.run(trial(design, n, commands=args.commands, rate_hz=args.rate, seed=r * 7919 + n))
                print(f"  {row}", flush=True)
                trials.setdefault(f"{design}/{n}", []).append(row)
    summary: dict[str, Any] = {}
    for key, rows in trials.items():
        summary[key] = {k: _median(rows, k) for k in ("bind_s", "rebind_s", "server_rss_mib", "p50_ms", "p99_ms")}
        summary[key]["consumers"] = rows[-1]["consumers"]
        summary[key]["results"] = f"{sum(r['results'] for r in rows)}/{sum(r['commands'] for r in rows)}"
    goals: dict[str, Any] = {}
    lo, hi = min(counts), max(counts)
    g_lo, g_hi = summary.get(f"gateway/{lo}"), summary.get(f"gateway/{hi}")
    if g_lo and g_hi and g_lo["p99_ms"] and g_hi["p99_ms"]:
        goals[f"gateway p99 at {hi} / at {lo} (goal <= 1.5)"] = round(g_hi["p99_ms"] / g_lo["p99_ms"], 2)
    v_hi = summary.get(f"vehicle/{hi}")
    if g_hi and v_hi and v_hi["server_rss_mib"]:
        goals[f"server memory at {hi}, gateway / vehicle (goal <= 0.1)"] = round(
            (g_hi["server_rss_mib"] or 0) / v_hi["server_rss_mib"], 3)
    if "gateway/1000" in summary:
        goals["gateway re-bind of 1,000 vehicles after a restart, s (goal < 2)"] = summary["gateway/1000"]["rebind_s"]
    report({"summary": summary, "goals": goals, "trials": trials, "rounds": args.rounds,
            "commands_per_trial": args.commands, "rate_hz": args.rate}, args.json or default_json("scale"))
    return 0
