"""`mavjet bench mixed --vehicles N --cmd-rate R`: command latency while the fleet streams state.

Runs on this machine: a nats-server, the simulator (its own process) with N
vehicles streaming at the gateway's configured rates, and a gateway with the
command service in this process. During the window an open-loop generator
sends R commands a second (`set_mode` to a vehicle's current mode, vehicles
in turn), each measured from publish to its `cmd_result` seen by the issuer,
while the gateway's state publishing is measured against the configured rate.
Open loop: a slow command does not slow the next one's start, so queueing
shows in the tail.

Baseline in the same run, at the same time: the bare JetStream round trip
(publish to TWIN_CMD, `fetch(1)` from a durable consumer, ack) at the same
rate on the same loaded machine. The ratio says what the command path adds
on top of what the loaded server and client already cost.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StreamConfig

from benchmarks.commands import command_gateway, commands_ready, summary
from benchmarks.kit import nats_and_sim, report
from gateway import logs
from gateway.contract.natsconn import open_client
from gateway.daemon import Gateway, tune_gc
from gateway.ops.client import CommandClient
from gateway.ops.natsserver import NatsServer

ENV = "bench"
BASE_STREAM = "BENCH_MIXED_BASE"
BASE_SUBJECT = "bench.mixed.base.cmd"  # outside TWIN_CMD's subjects


async def open_loop(rate_hz: float, seconds: float, fire: Any) -> float:
    """Start `fire(i)` every 1/rate s for `seconds`, without waiting for the previous ones; returns wall s."""
    period = 1.0 / rate_hz
    t0 = time.monotonic()
    async with anyio.create_task_group() as tg:
        i = 0
        while True:
            due = t0 + i * period
            if due - t0 >= seconds:
                break
            await anyio.sleep(max(0.0, due - time.monotonic()))
            tg.start_soon(fire, i)
            i += 1
    return time.monotonic() - t0


async def commands_at_rate(nc: Client, gw: Gateway, rate_hz: float, seconds: float) -> dict[str, Any]:
    vids = list(gw.twins)
    lat: list[float] = []
    results: dict[str, int] = {}
    async with CommandClient(nc, ENV, issuer="bench-mixed") as cc:
        async def fire(i: int) -> None:
            vid = vids[i % len(vids)]
            t0 = time.perf_counter()
            try:
                r = await cc.call(vid, "set_mode", {"mode": gw.twins[vid].telemetry.mode or "STABILIZE"}, timeout_s=30)
                res = str(r.result)
            except Exception as exc:  # a lost result is a figure here, not a crash
                res = f"error:{type(exc).__name__}"
            lat.append((time.perf_counter() - t0) * 1000.0)
            results[res] = results.get(res, 0) + 1

        wall = await open_loop(rate_hz, seconds, fire)
    out = summary(lat, len(lat), wall)
    out["results"] = results
    return out


async def bare_roundtrip_at_rate(url: str, rate_hz: float, seconds: float) -> dict[str, Any]:
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

    wall = await open_loop(rate_hz, seconds, fire)
    await sub.unsubscribe()
    await js.delete_stream(BASE_STREAM)
    await nc.close()
    out = summary(lat, len(lat), wall)
    out["errors"] = errors
    return out


async def run(args: argparse.Namespace, server: NatsServer, base: int, tmp: str) -> dict[str, Any]:
    n = args.vehicles
    nc, gw, service = await command_gateway(server, n, base, tmp)
    out: dict[str, Any] = {"vehicles": n, "cmd_rate_hz": args.cmd_rate, "duration_s": args.duration}

    async def measure() -> None:
        try:
            await gw.ready.wait()
            tune_gc()
            await commands_ready(gw, service, 120.0)
            print(f"gateway ready: {n} vehicles, measuring {args.duration:g} s at {args.cmd_rate:g} cmd/s", flush=True)
            await anyio.sleep(args.warmup)
            p0, t0 = gw.publisher.state_published, time.monotonic()
            async with anyio.create_task_group() as tg:
                async def cmds() -> None:
                    out["commands"] = await commands_at_rate(nc, gw, args.cmd_rate, args.duration)

                async def bare() -> None:
                    out["baseline_jetstream_roundtrip"] = await bare_roundtrip_at_rate(
                        server.url, args.cmd_rate, args.duration)

                tg.start_soon(cmds)
                tg.start_soon(bare)
            wall = time.monotonic() - t0
            expected = n * sum(gw.cfg.rates_hz.values()) * wall
            out["state_msgs_per_s"] = round((gw.publisher.state_published - p0) / wall, 1)
            out["state_expected_per_s"] = round(expected / wall, 1)
            out["state_delivered_ratio"] = round((gw.publisher.state_published - p0) / expected, 3)
        finally:
            gw.request_stop("bench done")

    async with anyio.create_task_group() as tg:
        tg.start_soon(measure)
        await gw.run()
    await nc.close()
    cmd, bare = out.get("commands", {}), out.get("baseline_jetstream_roundtrip", {})
    if cmd.get("p99_ms") and bare.get("p99_ms"):
        out["ratio_latency_p50"] = round(cmd["p50_ms"] / bare["p50_ms"], 2)
        out["ratio_latency_p99"] = round(cmd["p99_ms"] / bare["p99_ms"], 2)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mavjet bench mixed", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vehicles", type=int, default=100, help="simulated vehicles streaming state (default %(default)s)")
    p.add_argument("--cmd-rate", type=float, default=10.0, help="commands per second, open loop (default %(default)s)")
    p.add_argument("--duration", type=float, default=10.0, help="measurement window, seconds")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds of streaming before measuring")
    p.add_argument("--json", type=Path, default=None, help="write results here (default bench-mixed-N.json)")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.cmd_rate <= 0 or args.vehicles < 1:
        print("mavjet bench mixed: --cmd-rate must be > 0 and --vehicles >= 1", file=sys.stderr)
        return 2
    logs.configure("warning")
    with nats_and_sim(args.vehicles, preferred_port=26760) as (server, _sim, base, tmp):
        res = asyncio.run(run(args, server, base, tmp))
    report(res, args.json or Path(f"bench-mixed-{args.vehicles}.json"))
    return 0
