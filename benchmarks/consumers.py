"""`mavjet bench consumers --counts 1000,5000,10000`: what one durable consumer per vehicle costs.

TWIN_CMD has one durable pull consumer per vehicle today. For each count N
this creates N such consumers (filtered on `fleet.bench.veh.V<i>.cmd.>`, as
the gateway does) on a TWIN_CMD-like workqueue stream of a fresh nats-server,
then measures the server's resident memory and the command round trip
(publish to one vehicle's subject, `fetch(1)` on its consumer, ack) while the
N consumers exist. The baseline in the same run is N = 1. Figures per count:
server RSS, RSS per consumer, time to create them, round-trip p50/p99.
docs/capacity.md uses them.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StreamConfig

from mavjet.benchmarks.kit import (
    default_json,
    percentile,
    positive_int,
    positive_ints,
    process_rss_mib,
    report,
)
from mavjet.contract.natsconn import open_client
from mavjet.ops.natsserver import NatsServer

STREAM = "BENCH_CMD"


async def one_count(n: int, rounds: int) -> dict[str, Any]:
    tmp = tempfile.TemporaryDirectory(prefix="mavjet-bench-cons-")
    server = NatsServer(store_dir=f"{tmp.name}/js")
    server.start()
    assert server.proc is not None
    try:
        nc = await open_client(server.url)
        js = nc.jetstream(timeout=30)
        await js.add_stream(StreamConfig(name=STREAM, subjects=["fleet.bench.veh.*.cmd.>"],
                                         retention=RetentionPolicy.WORK_QUEUE, max_consumers=max(n + 10, 1000)))
        rss0 = process_rss_mib(server.proc.pid)
        t0 = time.monotonic()
        for i in range(n):
            await js.add_consumer(STREAM, ConsumerConfig(
                durable_name=f"gw_V{i}", filter_subject=f"fleet.bench.veh.V{i}.cmd.>",
                ack_policy=AckPolicy.EXPLICIT, ack_wait=30, max_ack_pending=1))  # fmt: skip
            if (i + 1) % 1000 == 0:
                print(f"  {i + 1}/{n} consumers", flush=True)
        create_s = time.monotonic() - t0
        await asyncio.sleep(1.0)  # let the server settle before reading its memory
        rss = process_rss_mib(server.proc.pid)
        lat: list[float] = []
        subs = {}
        for k in range(rounds):
            i = (k * 7919) % n  # spread over the consumers, deterministic
            if i not in subs:
                subs[i] = await js.pull_subscribe_bind(durable=f"gw_V{i}", stream=STREAM)
            t = time.perf_counter()
            await js.publish(f"fleet.bench.veh.V{i}.cmd.noop", b"x" * 64)
            msg = (await subs[i].fetch(1, timeout=10))[0]
            await msg.ack()
            lat.append((time.perf_counter() - t) * 1000.0)
        await nc.close()
        return {
            "consumers": n, "create_s": round(create_s, 2), "server_rss_mib": round(rss, 1),
            "rss_per_consumer_kib": round((rss - rss0) * 1024 / n, 2) if n else None,
            "roundtrip_p50_ms": percentile(lat, 0.5), "roundtrip_p99_ms": percentile(lat, 0.99),
        }
    finally:
        server.cleanup()
        tmp.cleanup()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mavjet bench consumers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--counts", type=positive_ints, default="1000,5000,10000",
                   help="consumer counts, comma separated (default %(default)s)")
    p.add_argument("--rounds", type=positive_int, default=300, help="round trips measured per count")
    p.add_argument("--json", type=Path, default=None, help="write results here "
                   "(default: benchmarks/results/consumers-STAMP.json in a checkout, docs/benchmarks.md)")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    counts: list[int] = args.counts
    out: dict[str, Any] = {}
    for n in [1, *counts]:
        print(f"{n} consumers ...", flush=True)
        out[str(n)] = asyncio.run(one_count(n, args.rounds))
        print(f"  {out[str(n)]}", flush=True)
    base = out["1"]
    for n in counts:
        row = out[str(n)]
        if base["roundtrip_p50_ms"] and row["roundtrip_p50_ms"]:
            row["ratio_p50_vs_1"] = round(row["roundtrip_p50_ms"] / base["roundtrip_p50_ms"], 2)
    report({"counts": out}, args.json or default_json("consumers"))
    return 0
