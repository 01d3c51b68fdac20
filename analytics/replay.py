"""`mavjet replay`: replay the event audit trail with Spark into Parquet and a report.

    mavjet replay --since 24h --out out/            # local[*]
    mavjet replay --from 2025-06-01 --to 2025-06-08 --master spark://host:7077 --out /shared/out
    mavjet replay --jobs timeline --vid VID-0001 --since 6h --out out/

Reads TWIN_EVENTS once through the `jetstream` source, keeps the decoded rows
cached, runs the jobs (mavjet.analytics.jobs) on them, writes one Parquet directory
per job, `summary.json`, and `report.html` (self-contained, inline SVG).
With a cluster master, `--out` must be a path every executor can write
(a shared filesystem or object store URL).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mavjet.analytics.options import format_time_us, parse_time_us
from mavjet.analytics.progress import LineProgress, Progress, QuietProgress, SparkTicker
from mavjet.analytics.session import DEFAULT_DRIVER_MEMORY, check_memory
from mavjet.contract.errors import ConfigError, MavjetError
from mavjet.contract.subjects import EVENTS_STREAM, check_token, event_filter
from mavjet.contract.units import parse_duration_s

JOBS = ("flights", "commands", "failsafes", "timeline")
# The jobs read the decoded columns only. The raw JSON (`data`) is the widest
# column by far; caching without it (and the constant stream/subject) keeps
# a 10M-event replay in memory instead of spilling or running out of heap.
# No job, output or page reads alt_msl_m, flavour or mav_result either (the
# first two are on every event): less to shuffle, sort and cache.
NOT_CACHED = ("stream", "subject", "data", "alt_msl_m", "flavour", "mav_result")
TIMELINE_REPORT_ROWS = 500


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayConfig:
    out: str
    url: str
    env: str = "prod"
    master: str = "local[*]"
    stream: str = EVENTS_STREAM
    start: dt.datetime | None = None
    end: dt.datetime | None = None
    creds: str | None = None
    partitions: int | None = None
    jobs: tuple[str, ...] = JOBS
    vids: tuple[str, ...] = ()
    report: bool = True
    driver_memory: str = DEFAULT_DRIVER_MEMORY

    def __post_init__(self) -> None:
        check_token("env", self.env)
        object.__setattr__(self, "driver_memory", check_memory("driver_memory", self.driver_memory))
        for v in self.vids:
            check_token("vid", v)
        unknown = set(self.jobs) - set(JOBS)
        if unknown:
            raise ConfigError("jobs", f"unknown job(s) {sorted(unknown)}; choose from {', '.join(JOBS)}")
        if "timeline" in self.jobs and not self.vids and self.jobs == ("timeline",):
            raise ConfigError("vid", "the timeline job needs --vid")
        if self.start is not None and self.end is not None and self.end <= self.start:
            raise ConfigError("to", "--to must be after --from")

    def source_options(self) -> dict[str, str]:
        # the jobs never read `data` (NOT_CACHED): not decoding it is a third less work per event
        opts = {"url": self.url, "stream": self.stream, "subjects": event_filter(self.env), "data": "false"}
        if self.start is not None:
            opts["start_time"] = self.start.isoformat()
        if self.end is not None:
            opts["end_time"] = self.end.isoformat()
        if self.creds:
            opts["creds"] = self.creds
        if self.partitions:
            opts["partitions"] = str(self.partitions)
        return opts


@dataclass(slots=True)
class Timings:
    steps: dict[str, float] = field(default_factory=dict)

    def mark(self, name: str, t0: float) -> float:
        now = time.perf_counter()
        self.steps[name] = round(now - t0, 3)
        return now


def read_events(spark: Any, cfg: ReplayConfig) -> Any:
    reader = spark.read.format("jetstream")
    for k, v in cfg.source_options().items():
        reader = reader.option(k, v)
    return reader.load()


def _when(t: dt.datetime) -> str:
    """A time for the report's range line: ISO 8601 to the second."""
    return t.isoformat(timespec="seconds")


def _path(out: str, name: str) -> str:
    return out.rstrip("/") + "/" + name


def run_replay(spark: Any, cfg: ReplayConfig, progress: Progress | None = None) -> dict[str, Any]:
    """Run the selected jobs; write Parquet, summary.json and report.html under cfg.out."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from mavjet.analytics import fleet, jobs
    from mavjet.analytics.report import ReportData, render

    prog: Progress = progress if progress is not None else QuietProgress()
    t_start = time.perf_counter()
    timings = Timings()
    out_local = None if "://" in cfg.out else Path(cfg.out)
    # flight_no/in_flight computed once, in the cache: the flights, failsafe
    # and flight-page jobs would otherwise each sort every event by vehicle.
    events = jobs.add_flight_columns(read_events(spark, cfg).drop(*NOT_CACHED)).persist(
        StorageLevel.MEMORY_AND_DISK
    )
    cached: list[Any] = []

    def keep(df: Any) -> Any:
        cached.append(df.persist())
        return df

    try:
        t0 = time.perf_counter()
        prog.stage("reading events from NATS")
        # One action reads, caches and counts: every Spark action costs ~1 s
        # of planning and scheduling on a laptop, whatever the data.
        counts = events.agg(
            F.count("*").alias("events"),
            F.count(F.when(F.col("error").isNotNull(), 1)).alias("errors"),
            F.countDistinct("vid").alias("vehicles"),
            F.min("time").alias("first"),
            F.max("time").alias("last"),
        ).first()
        assert counts is not None  # an aggregate without groups has one row
        n_events = int(counts["events"])
        t0 = timings.mark("read", t0)
        prog.done("read", timings.steps["read"], f"{n_events:,} events")
        summary: dict[str, Any] = {
            "events": n_events,
            "error_rows": counts["errors"],
            "vehicles": counts["vehicles"],
            "first_event": counts["first"].isoformat(timespec="seconds") if counts["first"] else None,
            "last_event": counts["last"].isoformat(timespec="seconds") if counts["last"] else None,
        }
        rd = ReportData(
            range_text=(
                f"stream {cfg.stream}, env {cfg.env}, from {_when(cfg.start) if cfg.start else 'the beginning'}"
                f" to {_when(cfg.end) if cfg.end else 'now'}, master {cfg.master}"
            )
        )

        def write(df: Any, name: str) -> None:
            df.write.mode("overwrite").parquet(_path(cfg.out, name))

        fl = chains = None
        if "flights" in cfg.jobs:
            prog.stage("flights")
            # a flight is an arm session in which the vehicle was airborne (jobs.flights)
            sessions = keep(jobs.arm_sessions(events))
            fl = sessions.where(F.col("airborne"))
            write(fl, "flights")
            # one row per vehicle (thousands at most): totals and the top 30 from one action
            per_vid = sessions.groupBy("vid").agg(
                F.count(F.when(F.col("airborne"), 1)).alias("n"),
                F.count(F.when(F.col("airborne") & F.col("complete"), 1)).alias("done"),
                F.count(F.when(~F.col("airborne"), 1)).alias("ground"),
            ).collect()
            summary["flights"] = sum(int(r["n"]) for r in per_vid)
            summary["flights_complete"] = sum(int(r["done"]) for r in per_vid)
            summary["armed_without_takeoff"] = sum(int(r["ground"]) for r in per_vid)
            top_vids = sorted((r for r in per_vid if int(r["n"])), key=lambda r: (-int(r["n"]), r["vid"]))[:30]
            rd.flights_per_vehicle = [(r["vid"], float(r["n"])) for r in top_vids]
            t0 = timings.mark("flights", t0)
            prog.done("flights", timings.steps["flights"], f"{summary['flights']:,} flights")

        if "commands" in cfg.jobs:
            prog.stage("commands and their effects")
            write(jobs.commands(events), "commands")
            # written and collected: cached so it is computed once
            lat = keep(jobs.command_latency(events).orderBy("name", "result"))
            write(lat.coalesce(1), "command_latency")
            rd.latency_rows = [r.asDict() for r in lat.collect()]
            rd.command_rows = jobs.command_mix(rd.latency_rows)
            summary["cmd_results"] = sum(int(r["count"]) for r in rd.command_rows)
            chains = keep(fleet.command_chains(events))
            write(chains, "command_chains")
            rd.chain_rows = [r.asDict() for r in fleet.chain_latency(chains).orderBy("name").collect()]
            t0 = timings.mark("commands", t0)
            prog.done("commands", timings.steps["commands"], f"{summary['cmd_results']:,} results")

        if fl is not None and chains is not None:
            kpis = keep(fleet.fleet_kpis(fl, chains))
            write(kpis.coalesce(1), "kpis")
            row = kpis.first()
            rd.kpis = row.asDict() if row is not None else {}
            summary["kpis"] = rd.kpis
            t0 = timings.mark("kpis", t0)

        if "failsafes" in cfg.jobs:
            prog.stage("failsafes")
            fse = jobs.failsafe_events(events).persist()
            write(fse, "failsafe_events")
            # per (day, vehicle, type): small, and the report's figures all follow from it (one action)
            fsc = keep(jobs.failsafe_counts(fse))
            write(fsc, "failsafes")
            fs_rows = fsc.select("day", "vid", "failsafe_type", "count").collect()
            summary["failsafes"] = sum(int(r["count"]) for r in fs_rows)
            days = sorted({r["day"].isoformat() for r in fs_rows})
            day_index = {d: i for i, d in enumerate(days)}
            series: dict[str, list[float]] = defaultdict(lambda: [0.0] * len(days))
            fs_per_vid: dict[str, int] = defaultdict(int)
            vid_types: dict[str, set[str]] = defaultdict(set)
            for r in fs_rows:
                series[r["failsafe_type"]][day_index[r["day"].isoformat()]] += float(r["count"])
                fs_per_vid[r["vid"]] += int(r["count"])
                vid_types[r["vid"]].add(r["failsafe_type"])
            rd.failsafe_days, rd.failsafe_series = days, dict(sorted(series.items()))
            rd.top_failsafe_vehicles = [
                {"vid": v, "failsafes": n, "types": ", ".join(sorted(vid_types[v]))}
                for v, n in sorted(fs_per_vid.items(), key=lambda kv: (-kv[1], kv[0]))[:15]
            ]
            fse.unpersist()
            t0 = timings.mark("failsafes", t0)
            prog.done("failsafes", timings.steps["failsafes"], f"{summary['failsafes']:,} failsafes")

        if "timeline" in cfg.jobs:
            prog.stage("timelines")
            for vid in cfg.vids:
                tl = jobs.timeline(events, vid, cfg.start, cfg.end)
                write(tl.coalesce(1), f"timeline/{vid}")
                rows = tl.limit(TIMELINE_REPORT_ROWS).collect()
                rd.timelines[vid] = [
                    {**r.asDict(), "time": r["time"].isoformat(timespec="milliseconds") if r["time"] else None}
                    for r in rows
                ]
            t0 = timings.mark("timeline", t0)
            prog.done("timelines", timings.steps["timeline"], f"{len(cfg.vids)} vehicles")

        if fl is not None and cfg.report and out_local is not None:
            from mavjet.analytics.flightpages import collect_flights, write_pages
            from mavjet.analytics.tracks import TrackReader

            prog.stage("flight pages")
            # the flight recorder's samples (TWIN_TRACKS) of the flights that get a page, when the server has any
            track = TrackReader(spark, cfg.source_options(), cfg.env)
            rd.flight_links = write_pages(out_local, collect_flights(events, fl, cfg.vids, track))
            summary["flight_pages"] = len(rd.flight_links)
            t0 = timings.mark("flight_pages", t0)
            prog.done("flight pages", timings.steps["flight_pages"], f"{len(rd.flight_links)} pages")
    finally:
        for df in cached:
            df.unpersist()
        events.unpersist()

    summary["timings_s"] = timings.steps
    summary["total_s"] = round(time.perf_counter() - t_start, 3)
    rd.summary = {k: v for k, v in summary.items() if not isinstance(v, dict)}
    if out_local is not None:
        out_local.mkdir(parents=True, exist_ok=True)
        (out_local / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        if cfg.report:
            (out_local / "report.html").write_text(render(rd), encoding="utf-8")
    summary["timelines"] = rd.timelines
    return summary


def _time_arg(value: str) -> dt.datetime:
    us = parse_time_us(value, key="time")
    return dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=us)


def build_parser() -> argparse.ArgumentParser:
    from mavjet.contract.natsconn import add_nats_arguments

    p = argparse.ArgumentParser(prog="mavjet replay", description=__doc__.split("\n\n")[0] if __doc__ else None)
    when = p.add_mutually_exclusive_group()
    when.add_argument("--since", help="replay the last DURATION (e.g. 24h, 7d)")
    when.add_argument("--from", dest="start", help="start time, ISO 8601 UTC (with --to)")
    p.add_argument("--to", dest="end", help="end time, ISO 8601 UTC (exclusive)")
    p.add_argument("--master", default="local[*]", help="Spark master: local[*] or spark://host:port")
    p.add_argument("--out", required=True, help="output directory (Parquet per job, summary.json, report.html)")
    p.add_argument("--jobs", default=",".join(JOBS), help="comma-separated subset of: " + ", ".join(JOBS))
    p.add_argument("--vid", action="append", default=[], help="vehicle for the timeline job (repeatable)")
    p.add_argument("--stream", default=EVENTS_STREAM, help="the audit stream to read (default %(default)s)")
    p.add_argument("--partitions", type=int, help="read partitions (default: one per 250k sequences, >= 2)")
    p.add_argument("--no-report", action="store_true", help="write the Parquet and summary.json, not report.html")
    p.add_argument(
        "--driver-memory", default=DEFAULT_DRIVER_MEMORY,
        help=f"Spark driver heap, e.g. 2g (default {DEFAULT_DRIVER_MEMORY}; on local[*] it also holds the cached events)",
    )
    add_nats_arguments(p)
    return p


def config_from_args(args: argparse.Namespace, *, now: dt.datetime | None = None) -> ReplayConfig:
    start = end = None
    if args.since:
        try:
            since_s = parse_duration_s(args.since)
        except ValueError as exc:
            raise ConfigError("since", str(exc)) from exc
        start = (now or dt.datetime.now(dt.UTC)) - dt.timedelta(seconds=since_s)
    elif args.start:
        start = _time_arg(args.start)
    if args.end:
        end = _time_arg(args.end)
    jobs = tuple(j.strip() for j in args.jobs.split(",") if j.strip())
    if args.vid and "timeline" not in jobs:
        jobs = (*jobs, "timeline")
    return ReplayConfig(
        out=args.out, url=args.nats, env=args.env, master=args.master, stream=args.stream, start=start, end=end,
        creds=args.creds, partitions=args.partitions, jobs=jobs, vids=tuple(args.vid), report=not args.no_report,
        driver_memory=args.driver_memory,
    )


PREFLIGHT_TIMEOUT = "5s"


def preflight(cfg: ReplayConfig) -> int:
    """Check that the stream can be read before Spark starts (~10 s saved on a typo'd URL).

    Returns the stream's last sequence; raises SourceError with one readable line.
    """
    from mavjet.analytics.natsread import latest_seq
    from mavjet.analytics.options import SourceOptions

    opts = SourceOptions.from_options({**cfg.source_options(), "timeout": PREFLIGHT_TIMEOUT})
    return latest_seq(opts)


def error_line(exc: BaseException) -> str:
    """One line for an exception that came back through Spark (a Py4J or Python worker trace).

    The data source raises SourceError; Spark wraps it in pages of JVM and
    worker traceback, so the line that names it is dug out of the text.
    """
    text = str(exc)
    for line in text.splitlines():
        if "SourceError:" in line or "jetstream source " in line:
            return line.split("SourceError:", 1)[-1].strip()
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"{type(exc).__name__}: {first[:300]}"


ANALYTICS_FIX = "install the analytics extra: `make report` does, or `.venv/bin/pip install -e '.[analytics]'`"
JAVA_FIX = "Spark needs Java 17 or 21: install one (e.g. apt install openjdk-17-jre-headless) or set JAVA_HOME to it"


def missing_requirement() -> str | None:
    """One line naming what `mavjet replay` needs and lacks (the analytics extra, a Java), or None."""
    import importlib.util
    import os
    import shutil

    for module in ("pyspark", "pandas", "pyarrow", "matplotlib"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed: {ANALYTICS_FIX}"
    home = os.environ.get("JAVA_HOME")
    if home:
        if not os.access(os.path.join(home, "bin", "java"), os.X_OK):
            return f"JAVA_HOME={home} has no bin/java: {JAVA_FIX}"
    elif shutil.which("java") is None:
        return f"no java on PATH and no JAVA_HOME: {JAVA_FIX}"
    return None


def main(argv: list[str]) -> int:
    """Exit 0 on success; 2 for a bad option or a stream that cannot be reached; 1 if a job fails."""
    args = build_parser().parse_args(argv)
    try:
        cfg = config_from_args(args)
    except ConfigError as exc:
        print(f"mavjet replay: {exc}", file=sys.stderr)
        return 2
    missing = missing_requirement()
    if missing is not None:
        print(f"mavjet replay: {missing}", file=sys.stderr)
        return 2
    from mavjet.analytics.natsread import SourceError

    progress = LineProgress()
    try:
        progress.stage(f"checking {cfg.stream} on {cfg.url}")
        last = preflight(cfg)
    except (SourceError, ConfigError) as exc:
        print(f"mavjet replay: {exc}", file=sys.stderr)
        return 2
    progress.done("check", 0.0, f"stream holds sequences up to {last:,}")
    from mavjet.analytics.session import get_spark

    t0 = time.perf_counter()
    progress.stage(f"starting Spark ({cfg.master})")
    try:
        spark = get_spark(cfg.master, driver_memory=cfg.driver_memory)
    except Exception as exc:  # no JVM: pyspark's JAVA_GATEWAY_EXITED after pages of trace
        print(f"mavjet replay: Spark could not start its JVM ({error_line(exc)}): {JAVA_FIX}", file=sys.stderr)
        return 2
    progress.done("Spark start", time.perf_counter() - t0)
    try:
        with SparkTicker(spark, progress.tick):
            summary = run_replay(spark, cfg, progress)
    except MavjetError as exc:
        print(f"mavjet replay: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # Spark wraps worker errors; show the cause, not a JVM trace
        print(f"mavjet replay: failed: {error_line(exc)}", file=sys.stderr)
        return 1
    finally:
        spark.stop()
    timelines = summary.pop("timelines", {})
    for vid, rows in timelines.items():
        print(f"--- timeline {vid} ({len(rows)} events shown)")
        for r in rows:
            print(f"{r['time']}  {r['type']:<22} {r['summary']}")
    summary["wall_s"] = round(time.perf_counter() - t0, 3)
    print(json.dumps(summary, indent=2, default=str))
    print(f"wrote {cfg.out}/ (Parquet per job, summary.json, report.html, flight-pages/)", file=sys.stderr)
    return 0


__all__ = ["JOBS", "LineProgress", "Progress", "ReplayConfig", "config_from_args", "format_time_us", "main", "run_replay"]
