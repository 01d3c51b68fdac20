"""`mavjet bench commands --vehicles N --duration S [--json OUT]`: command latency and throughput.

Runs on this machine: a nats-server, the simulator (a separate process, so
its CPU is not ours), and a gateway with the command executor in this
process. One closed-loop worker per vehicle publishes a cheap idempotent
command (`set_mode` to the vehicle's current mode: COMMAND_LONG → ACK, or
`param_get`: PARAM_REQUEST_READ → PARAM_VALUE), waits for its `cmd_result`
and publishes the next. Measured per command: publish → `cmd_result` seen by
the issuer (the full path: JetStream, pull, ledger, MAVLink round trip,
event spool, JetStream again).

In the same run, the baseline: the bare JetStream round trip the command
path is built on — N workers each publish to TWIN_CMD, pull it with fetch(1)
from their own durable consumer and ack it, with the same NATS client code
on the same event loop. The ratios say how much of the ceiling the command
path keeps.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from pathlib import Path
from typing import Any

import anyio
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StreamConfig

from mavjet.benchmarks.kit import (
    default_json,
    nats_and_sim,
    non_negative_int,
    percentile,
    percentile_ci,
    positive_float,
    positive_int,
    report,
)
from mavjet.contract.natsconn import NatsOptions, open_client
from mavjet.contract.subjects import CMD_STREAM, cmd_filter, cmd_subject
from mavjet.drivers.mavlink.transport import Endpoint
from mavjet.gateway.commands.consumer import CommandService
from mavjet.gateway.config import GatewayConfig, VehicleConfig
from mavjet.gateway.daemon import Gateway
from mavjet.gateway.entry import tune_process
from mavjet.gateway.runtime import logs
from mavjet.ops.client import CommandClient
from mavjet.ops.natsserver import NatsServer
from mavjet.ops.provision import DEFINITIONS_DIR, load_definitions, provision

ENV = "bench"


def summary(latencies_ms: list[float], count: int, wall_s: float) -> dict[str, Any]:
    return {
        "count": count,
        "per_s": round(count / wall_s, 1) if wall_s > 0 else None,
        "p50_ms": percentile(latencies_ms, 0.50),
        "p99_ms": percentile(latencies_ms, 0.99),
        "p99_ci95_ms": percentile_ci(latencies_ms, 0.99),
        "max_ms": round(max(latencies_ms), 3) if latencies_ms else None,
    }


async def baseline(url: str, workers: int, seconds: float) -> dict[str, Any]:
    """publish → fetch(1) → ack, N workers in parallel, each on its own consumer of TWIN_CMD."""
    nc = await open_client(url)
    js = nc.jetstream()
    subs = []
    for i in range(workers):
        vid = f"BASE-{i:04d}"
        name = f"bench_{vid}"
        await js.add_consumer(CMD_STREAM, ConsumerConfig(
            name=name, durable_name=name, filter_subject=cmd_filter(ENV, vid), ack_policy=AckPolicy.EXPLICIT,
            ack_wait=30, max_ack_pending=1,
        ))  # fmt: skip
        subs.append((vid, await js.pull_subscribe_bind(durable=name, stream=CMD_STREAM)))
    lat: list[float] = []
    count = 0
    stop_at = time.monotonic() + seconds

    async def worker(vid: str, sub: Any) -> None:
        nonlocal count
        subject = cmd_subject(ENV, vid, "noop")
        n = 0
        while time.monotonic() < stop_at:
            n += 1
            t0 = time.perf_counter()
            await js.publish(subject, b"x" * 64, headers={"Nats-Msg-Id": f"{vid}-{n}"})
            msg = (await sub.fetch(1, timeout=5))[0]
            await msg.ack()
            lat.append((time.perf_counter() - t0) * 1000.0)
            count += 1

    t0 = time.monotonic()
    await asyncio.gather(*(worker(vid, sub) for vid, sub in subs))
    wall = time.monotonic() - t0
    for vid, sub in subs:
        await sub.unsubscribe()
        await js.delete_consumer(CMD_STREAM, f"bench_{vid}")
    await nc.close()
    return summary(lat, count, wall)


async def command_load(nc: Client, gw: Gateway, command: str, seconds: float, warmup: int) -> dict[str, Any]:
    vids = list(gw.twins)
    lat: list[float] = []
    results: dict[str, int] = {}
    count = 0

    def params_for(vid: str) -> dict[str, Any]:
        if command == "param_get":
            return {"name": "RTL_ALT"}
        return {"mode": gw.twins[vid].telemetry.mode or "STABILIZE"}

    async with CommandClient(nc, ENV, issuer="bench") as cc:
        async def one(vid: str) -> tuple[float, str]:
            t0 = time.perf_counter()
            r = await cc.call(vid, command, params_for(vid), timeout_s=30)
            return (time.perf_counter() - t0) * 1000.0, r.result

        for vid in vids:  # warm up every path (consumer, ledger, link) before measuring
            for _ in range(warmup):
                await one(vid)
        stop_at = time.monotonic() + seconds

        async def worker(vid: str) -> None:
            nonlocal count
            while time.monotonic() < stop_at:
                ms, res = await one(vid)
                lat.append(ms)
                results[res] = results.get(res, 0) + 1
                count += 1

        t0 = time.monotonic()
        cpu0 = time.process_time()
        await asyncio.gather(*(worker(v) for v in vids))
        wall = time.monotonic() - t0
        cpu = time.process_time() - cpu0
    out = summary(lat, count, wall)
    out["results"] = results
    out["process_cpu_pct"] = round(100 * cpu / wall, 1)
    out["cpu_ms_per_command"] = round(cpu / max(1, count) * 1000, 3)
    return out


async def command_gateway(server: NatsServer, n: int, base: int, tmp: str) -> tuple[Client, Gateway, CommandService]:
    """A provisioned server, and a gateway with the command service for N sim vehicles from `base`."""
    nc = await open_client(server.url)
    await provision(nc.jetstream(), load_definitions(DEFINITIONS_DIR, env=ENV, replicas=1))
    cfg = GatewayConfig(
        vehicles=tuple(VehicleConfig(vid=f"VID-{i + 1:04d}", endpoint=Endpoint.parse(f"tcp:127.0.0.1:{base + 10 * i}"))
                       for i in range(n)),
        nats=NatsOptions(servers=(server.url,)), env=ENV, instance="bench",
        state_dir=Path(tmp) / "state", startup_timeout_s=max(15.0, n / 10),
    )
    gw = Gateway(cfg)
    service = CommandService()
    gw.services.append(service)
    return nc, gw, service


async def commands_ready(gw: Gateway, service: CommandService, timeout_s: float) -> None:
    """Every vehicle's consumer bound and every mode known, or RuntimeError after `timeout_s`."""
    for _ in range(int(timeout_s * 10)):  # a bounded poll: readiness spans many objects, no one event
        if (len(service.lanes) == len(gw.twins) and all(lp.binds for lp in service.lanes.values())
                and all(t.telemetry.mode for t in gw.twins.values())):
            return
        await anyio.sleep(0.1)
    raise RuntimeError(f"the gateway's command consumers did not start within {timeout_s:.0f} s")


async def run(args: argparse.Namespace, server: NatsServer, base: int, tmp: str) -> dict[str, Any]:
    n = args.vehicles
    nc, gw, service = await command_gateway(server, n, base, tmp)
    out: dict[str, Any] = {"vehicles": n, "command": args.command, "duration_s": args.duration}

    async def measure() -> None:
        try:
            await gw.ready.wait()
            tune_process()  # as the daemon's process entry does
            await commands_ready(gw, service, 60.0)
            out["links_up"] = sum(1 for t in gw.twins.values() if t.session.is_up)
            out["commands"] = await command_load(nc, gw, args.command, args.duration, args.warmup)
            out["ledger_entries"] = service.ledger.count_sync() if service.ledger else None
        finally:
            gw.request_stop("bench done")

    async with anyio.create_task_group() as tg:
        tg.start_soon(measure)
        await gw.run()
    await nc.close()
    out["baseline_jetstream_roundtrip"] = await baseline(server.url, n, args.baseline_seconds)
    cmd, base_fig = out["commands"], out["baseline_jetstream_roundtrip"]
    if cmd["per_s"] and base_fig["per_s"]:
        out["ratio_throughput"] = round(cmd["per_s"] / base_fig["per_s"], 3)
    if cmd["p50_ms"] and base_fig["p50_ms"]:
        out["ratio_latency_p50"] = round(cmd["p50_ms"] / base_fig["p50_ms"], 2)
        out["ratio_latency_p99"] = round(cmd["p99_ms"] / base_fig["p99_ms"], 2)
    return out


BASE_STREAM = "BENCH_MIXED_BASE"
BASE_SUBJECT = "bench.mixed.base.cmd"  # outside TWIN_CMD's subjects


async def open_loop(rate_hz: float, seconds: float, fire: Any, *, poisson_seed: int | None = None) -> float:
    """Start `fire(i)` at `rate_hz` for `seconds`, without waiting for the previous ones; returns wall s.

    Evenly every 1/rate s, or with `poisson_seed` at a Poisson process's times of that mean rate
    (exponential gaps from a generator seeded so, the same schedule on both sides of a comparison).
    Even arrivals at a fleet's own telemetry rate keep one phase to its bursts for a whole run,
    so a run measures one phase; Poisson arrivals land on every phase in every run."""
    rng = random.Random(poisson_seed) if poisson_seed is not None else None
    period = 1.0 / rate_hz
    t0 = time.monotonic()
    async with anyio.create_task_group() as tg:
        i, offset = 0, 0.0
        while True:
            offset = offset + rng.expovariate(rate_hz) if rng is not None else i * period
            if offset >= seconds:
                break
            await anyio.sleep(max(0.0, t0 + offset - time.monotonic()))
            tg.start_soon(fire, i)
            i += 1
    return time.monotonic() - t0


async def bare_roundtrip_at_rate(url: str, rate_hz: float, seconds: float, *,
                                 poisson_seed: int | None = None) -> dict[str, Any]:
    nc = await open_client(url)
    js = nc.jetstream()
    name = "bench_mixed_base"
    # Its own workqueue stream, configured like TWIN_CMD: nats-server 2.15 allows 1,000 consumers
    # a stream by default, and at 1,000 vehicles TWIN_CMD has them all (docs/capacity.md).
    await js.add_stream(StreamConfig(name=BASE_STREAM, subjects=[BASE_SUBJECT],
                                     retention=RetentionPolicy.WORK_QUEUE, max_age=300, duplicate_window=120))
    await js.add_consumer(BASE_STREAM, ConsumerConfig(
        name=name, durable_name=name, filter_subject=BASE_SUBJECT, ack_policy=AckPolicy.EXPLICIT,
        ack_wait=30, max_ack_pending=1000))  # fmt: skip
    sub = await js.pull_subscribe_bind(durable=name, stream=BASE_STREAM)
    lat: list[float] = []
    errors: dict[str, int] = {}
    lock = anyio.Lock()  # one fetcher at a time on the one consumer, as a vehicle's loop would

    async def fire(i: int) -> None:
        t0 = time.perf_counter()
        try:
            await js.publish(BASE_SUBJECT, b"x" * 64, headers={"Nats-Msg-Id": f"base-{i}"})
            async with lock:
                msg = (await sub.fetch(1, timeout=10))[0]
            await msg.ack()
        except Exception as exc:  # a loaded server timing out is a figure of the baseline, not a crash
            key = f"error:{type(exc).__name__}"
            errors[key] = errors.get(key, 0) + 1
            return
        lat.append((time.perf_counter() - t0) * 1000.0)

    wall = await open_loop(rate_hz, seconds, fire, poisson_seed=poisson_seed)
    await sub.unsubscribe()
    await js.delete_stream(BASE_STREAM)
    await nc.close()
    out = summary(lat, len(lat), wall)
    out["errors"] = errors
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mavjet bench commands", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vehicles", type=positive_int, default=5, help="simulated vehicles, one closed-loop worker each")
    p.add_argument("--duration", type=positive_float, default=10.0, help="measurement window, seconds")
    p.add_argument("--command", choices=["set_mode", "param_get"], default="set_mode",
                   help="the idempotent command to send (default: %(default)s to the current mode)")
    p.add_argument("--warmup", type=non_negative_int, default=3, help="unmeasured commands per vehicle first")
    p.add_argument("--baseline-seconds", type=positive_float, default=5.0, help="how long to measure the JetStream baseline")
    p.add_argument("--json", type=Path, default=None, help="write results here "
                   "(default: benchmarks/results/commands-N-STAMP.json in a checkout, docs/benchmarks.md)")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    logs.configure("warning")
    n = args.vehicles
    with nats_and_sim(n, preferred_port=26760, prefix="mavjet-bench-cmd-") as (server, _sim, base, tmp):
        res = anyio.run(run, args, server, base, tmp, backend="asyncio")
    report(res, args.json or default_json(f"commands-{n}"), width=30)
    return 0
