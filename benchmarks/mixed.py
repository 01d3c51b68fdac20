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
import contextlib
import sys
import time
from pathlib import Path
from typing import Any

import anyio

from mavjet.benchmarks.commands import (
    command_gateway,
    commands_ready,
)
from mavjet.benchmarks.compare import ref_worktree
from mavjet.benchmarks.kit import (
    cpu_hogs,
    default_json,
    nats_and_sim,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    report,
)
from mavjet.benchmarks.mixedproc import command_seed, commands_at_rate, run_process, with_baseline
from mavjet.gateway.entry import tune_process
from mavjet.gateway.runtime import logs
from mavjet.ops.natsserver import NatsServer

ENV = "bench"


async def run(args: argparse.Namespace, server: NatsServer, base: int, tmp: str) -> dict[str, Any]:
    n = args.vehicles
    nc, gw, service = await command_gateway(server, n, base, tmp)
    out: dict[str, Any] = {"vehicles": n, "cmd_rate_hz": args.cmd_rate, "duration_s": args.duration,
                           "arrivals": args.arrivals}

    vids = list(gw.twins)

    async def measure() -> None:
        try:
            await gw.ready.wait()
            tune_process()
            await commands_ready(gw, service, 120.0)
            print(f"gateway ready: {n} vehicles, measuring {args.duration:g} s at {args.cmd_rate:g} cmd/s", flush=True)
            await anyio.sleep(args.warmup)
            p0, t0 = gw.publisher.state_published, time.monotonic()
            def pick(i: int) -> tuple[str, str]:  # vehicles in turn, each to the mode it is in
                vid = vids[i % len(vids)]
                return vid, gw.twins[vid].telemetry.mode or "STABILIZE"

            seed = command_seed(args)
            out.update(await with_baseline(commands_at_rate(nc, pick, args.cmd_rate, args.duration, poisson_seed=seed),
                                           server.url, args.cmd_rate, args.duration, poisson=seed is not None))
            wall = time.monotonic() - t0
            expected = n * sum(gw.cfg.rates_hz.values()) * wall
            out["state_msgs_per_s"] = round((gw.publisher.state_published - p0) / wall, 1)
            out["state_expected_per_s"] = round(expected / wall, 1)
            out["state_delivered_ratio"] = round((gw.publisher.state_published - p0) / expected, 3)
            out["nats_gomaxprocs"] = server.go_max_procs
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
    p.add_argument("--vehicles", type=positive_int, default=100, help="simulated vehicles streaming state (default %(default)s)")
    p.add_argument("--cmd-rate", type=positive_float, default=10.0, help="commands per second, open loop (default %(default)s)")
    p.add_argument("--arrivals", choices=["even", "poisson"], default="even",
                   help="when commands are issued: evenly every 1/rate s, or at a Poisson process's times of "
                   "that mean rate, the same seeded schedule in every run (default %(default)s). Even "
                   "arrivals at the fleet's own 10 Hz keep one phase to its telemetry bursts for a whole "
                   "run; Poisson arrivals land on every phase in every run")
    p.add_argument("--duration", type=positive_float, default=10.0, help="measurement window, seconds")
    p.add_argument("--warmup", type=non_negative_float, default=3.0, help="seconds of streaming before measuring")
    p.add_argument("--shaping", action="store_true",
                   help="let the uplink shaper shed state (off: every configured sample is published, as in "
                   "`bench ingest`)")
    p.add_argument("--uvloop", action="store_true",
                   help="run the gateway on uvloop (its `uvloop = true`, as an edge hub would; with --gateway-ref "
                   "both builds)")
    p.add_argument("--in-process", action="store_true",
                   help="run the gateway in this process, on the issuer's event loop (the first version's setup)")
    p.add_argument("--gateway-ref", metavar="REF",
                   help="run the gateway of git REF (a temporary worktree) under the same benchmark: today's code "
                   "against the new on one machine in one session")
    p.add_argument("--scrape-every", type=non_negative_float, default=0.0, metavar="S",
                   help="GET the gateway's /metrics every S seconds during the window, as Prometheus would "
                   "(OpenMetrics); a scrape's cost is the event loop's (default 0: only before and after)")
    p.add_argument("--cpu-hog", type=non_negative_int, default=0, metavar="K",
                   help="K busy processes beside the whole run: other work on the machine (a video encoder on "
                   "a companion computer, other services on a hub)")
    p.add_argument("--hog-nice", type=hog_nice, default=0, metavar="N",
                   help="the busy processes' nice value, 0..19: 0 weighs them as mavjet's own processes; higher "
                   "gives mavjet the larger CPU share under contention, as `CPUWeight=` or `cpu_shares` would "
                   "(default %(default)s)")
    p.add_argument("--json", type=Path, default=None, help="write results here "
                   "(default: benchmarks/results/mixed-N-STAMP.json in a checkout, docs/benchmarks.md)")
    return p


def hog_nice(text: str) -> int:
    value = non_negative_int(text)
    if value > 19:
        raise argparse.ArgumentTypeError(f"{text!r}: nice values go up to 19")
    return value


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.scrape_every and args.in_process:
        print("mavjet bench mixed: --scrape-every needs the gateway as a process; drop --in-process", file=sys.stderr)
        return 2
    if args.uvloop and args.in_process:
        print("mavjet bench mixed: --uvloop is the gateway process's event loop; drop --in-process", file=sys.stderr)
        return 2
    if args.gateway_ref and args.in_process:
        print("mavjet bench mixed: --gateway-ref runs the gateway as a process; drop --in-process", file=sys.stderr)
        return 2
    logs.configure("warning")
    with contextlib.ExitStack() as stack:
        if args.gateway_ref:
            _root, args.gateway_tree, sha = stack.enter_context(ref_worktree(args.gateway_ref))
            args.gateway_build = f"{args.gateway_ref} ({sha})"
        return _main(args)


def _main(args: argparse.Namespace) -> int:
    with cpu_hogs(args.cpu_hog, nice=args.hog_nice), \
            nats_and_sim(args.vehicles, preferred_port=26760) as (server, sim, base, tmp):
        if args.in_process:
            res = asyncio.run(run(args, server, base, tmp))
        else:
            res = asyncio.run(run_process(args, server, sim.pid, base, tmp))
    res.update({"cpu_hog": args.cpu_hog, "hog_nice": args.hog_nice})
    report(res, args.json or default_json(f"mixed-{args.vehicles}"))
    return 0
