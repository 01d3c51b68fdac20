"""`mavjet bench replay --events N`: how fast the data source reads, against the ceiling.

Fills TWIN_EVENTS with N events from `sim audit` (a private nats-server unless
--nats is given), then measures in one run:
- ceiling: one process reading the whole stream with an ordered consumer
  callback, (a) only counting messages and (b) decoding them into columns the
  way each Spark partition does;
- the `jetstream` data source on Spark local[2] reading every column
  (`noop` sink, so nothing but the read is timed), as events/s;
- the whole replay end to end: `mavjet replay` in a fresh process (Python
  and Spark start, read, every job, Parquet, report), as an operator runs it.
Prints the figures and ratios and writes them as JSON (--json, or `kit.default_json`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mavjet.analytics.options import SourceOptions
from mavjet.analytics.session import DEFAULT_DRIVER_MEMORY, check_memory
from mavjet.benchmarks.kit import default_json, positive_int
from mavjet.contract.errors import ConfigError
from mavjet.contract.natsconn import open_client
from mavjet.contract.subjects import EVENTS_STREAM

EVENTS_PER_VEHICLE_DAY = 16  # what sim audit generates with its defaults (measured: ~16.6)
ENV = "bench"
END_TO_END_GOAL_S = 60.0  # issue 16: 1M events end to end on local[2]


async def _fill(url: str, events: int, seed: int) -> dict[str, Any]:

    from mavjet.analytics.synth import AuditConfig, Truth, default_end_ns, publish
    from mavjet.ops.synth import ensure_stream

    days = 90
    vehicles = max(1, math.ceil(events / (days * EVENTS_PER_VEHICLE_DAY)) + 1)
    cfg = AuditConfig(vehicles=vehicles, days=days, seed=seed, env=ENV, end_ns=default_end_ns())
    nc = await open_client(url, connect_timeout=5)
    try:
        await ensure_stream(nc, ENV)
        t0 = time.perf_counter()
        n = await publish(nc.jetstream(publish_async_max_pending=4000), cfg, Truth(keep_detail=False), max_events=events)
        dt_s = time.perf_counter() - t0
        info = await nc.jetstream().stream_info(EVENTS_STREAM)
    finally:
        await nc.close()
    return {"published": n, "vehicles": vehicles, "days": days, "publish_s": round(dt_s, 3),
            "publish_events_per_s": round(n / dt_s), "stream_messages": info.state.messages,
            "stream_bytes": info.state.bytes, "first_seq": info.state.first_seq, "last_seq": info.state.last_seq}


async def _ceiling_count(url: str, first: int, last: int) -> float:
    """Seconds for one ordered-consumer callback to receive [first, last], doing nothing else."""
    from nats.js import api

    from mavjet.analytics.natsread import _seq_and_pending

    nc = await open_client(url, connect_timeout=5)
    done = asyncio.Event()
    count = 0

    async def cb(msg: Any) -> None:
        nonlocal count
        count += 1
        seq, pending = _seq_and_pending(msg.reply)
        if seq >= last or pending == 0:
            done.set()

    try:
        t0 = time.perf_counter()
        sub = await nc.jetstream().subscribe(
            "", stream=EVENTS_STREAM, cb=cb, ordered_consumer=True,
            config=api.ConsumerConfig(deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=first),
        )
        async with asyncio.timeout(600):
            await done.wait()
        elapsed = time.perf_counter() - t0
        await sub.unsubscribe()
    finally:
        await nc.close()
    return elapsed


def _ceiling_decode(url: str, first: int, last: int) -> tuple[float, int]:
    """Seconds for the data source's own range reader (callback + decode to columns), one process."""
    from mavjet.analytics.natsread import iter_range

    opts = SourceOptions(url=url, batch_rows=50_000)
    t0 = time.perf_counter()
    rows = sum(len(cols[0]) for cols in iter_range(opts, first, last))
    return time.perf_counter() - t0, rows


Stage = Callable[[str, dict[str, Any]], None]


def run(
    url: str,
    events: int,
    *,
    seed: int,
    master: str,
    out_dir: str,
    partitions: int | None,
    driver_memory: str = DEFAULT_DRIVER_MEMORY,
    on_stage: Stage | None = None,
    spark: Any = None,
) -> dict[str, Any]:
    """Measure every stage; `on_stage(name, figures so far)` runs after each one,
    so a run that dies late (a 10M replay takes most of an hour) keeps what it measured.

    Without `spark`, a session is started (and timed) for the source reads and
    stopped before the end-to-end replay; a session passed in is used and left
    running. The replay always runs in a process of its own, started cold."""
    from mavjet.analytics.session import get_spark

    def stage(name: str) -> None:
        if on_stage is not None:
            on_stage(name, res)

    res: dict[str, Any] = {"events_requested": events, "master": master, "cpus": os.cpu_count(),
                           "python": platform.python_version(), "driver_memory": driver_memory,
                           # other work on the machine skews every figure: record it with them
                           "loadavg_1m_start": round(os.getloadavg()[0], 2), "complete": False}
    fill = asyncio.run(_fill(url, events, seed))
    res["fill"] = fill
    stage("fill")
    first, last = fill["first_seq"], fill["last_seq"]
    n = fill["stream_messages"]

    t = asyncio.run(_ceiling_count(url, first, last))
    res["ceiling_callback_events_per_s"] = round(n / t)
    stage("ceiling_callback")
    t, rows = _ceiling_decode(url, first, last)
    if rows != n:
        raise RuntimeError(f"range reader returned {rows} rows for {n} messages")
    res["ceiling_callback_decode_events_per_s"] = round(n / t)
    stage("ceiling_decode")

    own_session = spark is None
    t0 = time.perf_counter()
    if own_session:
        spark = get_spark(master, app_name="mavjet-bench-replay", driver_memory=driver_memory)
    res["spark_session_s"] = round(time.perf_counter() - t0, 3)
    try:
        reader = spark.read.format("jetstream").option("url", url)
        if partitions:
            reader = reader.option("partitions", str(partitions))
        df = reader.load()
        res["read_partitions"] = df.rdd.getNumPartitions()
        t0 = time.perf_counter()
        df.write.format("noop").mode("overwrite").save()
        read_s = time.perf_counter() - t0
        res["source_read_s"] = round(read_s, 3)
        res["source_events_per_s"] = round(n / read_s)
        res["ratio_source_to_callback_ceiling"] = round(n / read_s / res["ceiling_callback_events_per_s"], 3)
        res["ratio_source_to_decode_ceiling"] = round(n / read_s / res["ceiling_callback_decode_events_per_s"], 3)
        # as the replay reads: typed columns only, the `data` JSON left null
        t0 = time.perf_counter()
        reader.option("data", "false").load().write.format("noop").mode("overwrite").save()
        typed_s = time.perf_counter() - t0
        res["source_typed_read_s"] = round(typed_s, 3)
        res["source_typed_events_per_s"] = round(n / typed_s)
        res["ratio_source_typed_to_callback_ceiling"] = round(n / typed_s / res["ceiling_callback_events_per_s"], 3)
    finally:
        if own_session:
            spark.stop()
    stage("source")
    res["loadavg_1m_before_replay"] = round(os.getloadavg()[0], 2)
    res["jvm_class_archive"] = _class_archive_state()
    summary, wall_s = _replay_process(url, master=master, out_dir=out_dir, partitions=partitions,
                                      driver_memory=driver_memory)
    res["end_to_end_s"] = round(wall_s, 3)
    res["end_to_end_goal_s"] = END_TO_END_GOAL_S
    res["end_to_end_events_per_s"] = round(n / wall_s)
    res["replay_s"] = summary["total_s"]
    # Spark start and the NATS check: what the process spent before the jobs' clock started
    res["replay_start_s"] = round(wall_s - summary["total_s"], 3)
    res["replay_steps_s"] = summary["timings_s"]
    res["replay_events"] = summary["events"]
    res["replay_flights"] = summary.get("flights")
    res["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    res["complete"] = True
    stage("replay")
    return res


def _class_archive_state() -> str:
    """What the replay's JVM will do with the class-data archive (mavjet.analytics.classcache):
    `used`, `recorded` (first run: its exit includes the dump) or `off`."""
    from mavjet.analytics.classcache import archive_options
    from mavjet.analytics.session import DEFAULT_JVM_OPTIONS

    opts, tmp, _ = archive_options(DEFAULT_JVM_OPTIONS)
    return "off" if not opts else "recorded" if tmp is not None else "used"


def _replay_process(
    url: str, *, master: str, out_dir: str, partitions: int | None, driver_memory: str
) -> tuple[dict[str, Any], float]:
    """Run `mavjet replay` in a fresh interpreter; its summary (stdout JSON) and wall seconds.

    Its progress lines (stderr) pass through, so a long run shows where it is."""
    cmd = [sys.executable, "-m", "mavjet.ops.cli", "replay", "--nats", url, "--env", ENV, "--master", master,
           "--out", out_dir, "--driver-memory", driver_memory]
    if partitions:
        cmd += ["--partitions", str(partitions)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
    wall_s = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"mavjet replay exited with {proc.returncode}")
    summary: dict[str, Any] = json.loads(proc.stdout)
    return summary, wall_s


def _line(name: str, res: dict[str, Any]) -> str:
    """The printed figure of one stage."""
    if name == "fill":
        f = res["fill"]
        return (f"events in stream:                 {f['stream_messages']:,} ({f['stream_bytes'] / 1e6:,.0f} MB)\n"
                f"publish (sim audit):              {f['publish_events_per_s']:,} events/s")
    if name == "ceiling_callback":
        return f"ceiling, callback only:           {res['ceiling_callback_events_per_s']:,} events/s"
    if name == "ceiling_decode":
        return f"ceiling, callback + decode:       {res['ceiling_callback_decode_events_per_s']:,} events/s"
    if name == "source":
        return (f"data source on {res['master']} ({res['read_partitions']} partitions): "
                f"{res['source_events_per_s']:,} events/s ({res['source_read_s']} s)\n"
                f"ratio source / callback ceiling:  {res['ratio_source_to_callback_ceiling']}\n"
                f"ratio source / decode ceiling:    {res['ratio_source_to_decode_ceiling']}\n"
                f"source, typed columns only:       {res['source_typed_events_per_s']:,} events/s "
                f"({res['source_typed_read_s']} s); ratio to callback ceiling "
                f"{res['ratio_source_typed_to_callback_ceiling']}")
    steps = ", ".join(f"{k} {v}" for k, v in res["replay_steps_s"].items() if v >= 0.05)
    return (f"replay end to end (mavjet replay): {res['end_to_end_s']} s for {res['replay_events']:,} events "
            f"(goal < {res['end_to_end_goal_s']:.0f} s at 1M): start {res['replay_start_s']} s, jobs {res['replay_s']} s, "
            f"JVM class archive {res['jvm_class_archive']}\n"
            f"replay steps (s):                 {steps}\n"
            f"load average (1 min) start/replay/end: {res['loadavg_1m_start']} / {res['loadavg_1m_before_replay']} / "
            f"{res['loadavg_1m_end']} on {res['cpus']} CPUs")


def main(argv: list[str]) -> int:
    if argv and argv[0] == "replay":
        argv = argv[1:]
    p = build_parser()
    args = p.parse_args(argv)
    try:
        check_memory("driver_memory", args.driver_memory)
    except ConfigError as exc:
        p.error(str(exc))
    return _run(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mavjet bench replay", description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--events", type=positive_int, default=1_000_000, help="events `sim audit` puts in TWIN_EVENTS first "
                   "(default %(default)s)")
    p.add_argument("--nats", help="use this server (its TWIN_EVENTS must be empty or hold env 'bench'); default: a private one")
    p.add_argument("--master", default="local[2]", help="Spark master URL (default %(default)s)")
    p.add_argument("--partitions", type=positive_int, help="read partitions (default: the source's own choice)")
    p.add_argument("--driver-memory", default=DEFAULT_DRIVER_MEMORY, help=f"Spark driver heap (default {DEFAULT_DRIVER_MEMORY})")
    p.add_argument("--seed", type=int, default=1, help="the synthetic events' seed (default %(default)s)")
    p.add_argument("--json", help="write the figures to this file, rewritten after every stage ('complete' says if it "
                   "finished; default: benchmarks/results/replay-N-STAMP.json in a checkout, docs/benchmarks.md)")
    return p


def _run(args: argparse.Namespace) -> int:
    from mavjet.ops.natsserver import NatsServer

    out = Path(args.json) if args.json else default_json(f"replay-{args.events}")
    out.parent.mkdir(parents=True, exist_ok=True)

    def on_stage(name: str, res: dict[str, Any]) -> None:
        print(_line(name, res), flush=True)
        with out.open("w", encoding="utf-8") as f:
            json.dump(res, f, indent=2)
            f.write("\n")

    kw: dict[str, Any] = {"seed": args.seed, "master": args.master, "partitions": args.partitions,
                          "driver_memory": args.driver_memory, "on_stage": on_stage}
    with tempfile.TemporaryDirectory(prefix="mavjet-bench-replay-") as tmp:
        if args.nats:
            run(args.nats, args.events, out_dir=f"{tmp}/out", **kw)
        else:
            with NatsServer(store_dir=f"{tmp}/js") as srv:
                run(srv.url, args.events, out_dir=f"{tmp}/out", **kw)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
