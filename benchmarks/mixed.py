"""`mavjet bench mixed --vehicles N --cmd-rate R`: command latency while the fleet streams state.

Runs on this machine: a nats-server, the simulator (its own process) with N
vehicles streaming at the gateway's configured rates, and the real `mavjet
gateway` as its own process (benchmarks/mixedproc.py; `--in-process` runs it
in this process instead, sharing the issuer's event loop). During the window an open-loop generator
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

from benchmarks.commands import (
    bare_roundtrip_at_rate,
    command_gateway,
    commands_ready,
    open_loop,
    summary,
)
from benchmarks.kit import nats_and_sim, report
from benchmarks.mixedproc import run_process
from gateway import logs
from gateway.daemon import Gateway, tune_gc
from gateway.ops.client import CommandClient
from gateway.ops.natsserver import NatsServer

ENV = "bench"


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
    p.add_argument("--in-process", action="store_true",
                   help="run the gateway in this process, on the issuer's event loop (the first version's setup)")
    p.add_argument("--json", type=Path, default=None, help="write results here (default bench-mixed-N.json)")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.cmd_rate <= 0 or args.vehicles < 1:
        print("mavjet bench mixed: --cmd-rate must be > 0 and --vehicles >= 1", file=sys.stderr)
        return 2
    logs.configure("warning")
    with nats_and_sim(args.vehicles, preferred_port=26760) as (server, sim, base, tmp):
        if args.in_process:
            res = asyncio.run(run(args, server, base, tmp))
        else:
            res = asyncio.run(run_process(args, server, sim.pid, base, tmp))
    report(res, args.json or Path(f"bench-mixed-{args.vehicles}.json"))
    return 0
