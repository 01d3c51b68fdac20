"""`mavjet replay`: Parquet per job, summary and report; the same results on a standalone cluster."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mavjet.analytics.replay import ReplayConfig, build_parser, config_from_args, run_replay
from mavjet.contract.errors import ConfigError
from tests.analytics.support import ENV, History, parquet_rows, start_standalone

OUTPUTS = {
    "flights": ["vid", "flight_no"],
    "commands": ["name", "vid"],
    "command_latency": ["name", "result"],
    "failsafes": ["day", "vid", "failsafe_type"],
    "failsafe_events": ["vid", "time", "seq"],
    "timeline/VID-0002": ["time", "seq"],
}


def _range(history: History) -> tuple[dt.datetime, dt.datetime]:
    start = dt.datetime.fromtimestamp(history.cfg.start_ns / 1e9, dt.UTC)
    return start, start + dt.timedelta(days=history.cfg.days + 1)


@pytest.fixture(scope="module")
def local_out(spark: Any, history: History, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("replay-local")
    start, end = _range(history)
    cfg = ReplayConfig(out=str(out), url=history.url, env=ENV, start=start, end=end, vids=("VID-0002",))
    return out, run_replay(spark, cfg)


# The limit covers the module's fixtures (history + a local replay running
# every job: ~25 Spark actions, 1-2 s each on a loaded 2-core machine).
@pytest.mark.timeout(300)
def test_replay_writes_parquet_summary_and_report(local_out: tuple[Path, dict[str, Any]], history: History, spark: Any) -> None:
    out, summary = local_out
    truth = history.truth
    assert summary["events"] == truth.events and summary["error_rows"] == 0
    assert summary["flights"] == len(truth.flights) and summary["failsafes"] == len(truth.failsafes)
    assert summary["cmd_results"] == len(truth.commands) and summary["vehicles"] == history.cfg.vehicles
    assert summary["armed_without_takeoff"] == 0  # every synthetic arm takes off
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk["flights"] == summary["flights"] and on_disk["timings_s"]["read"] > 0
    for name in OUTPUTS:
        assert (out / name / "_SUCCESS").exists(), name
    assert spark.read.parquet(str(out / "flights")).count() == len(truth.flights)
    page = (out / "report.html").read_text()
    assert page.count("<svg") == 3 and "<script" not in page
    assert "VID-0002" in page and "Timeline" in page
    top_vid, top_n = truth.flights_by_vid.most_common(1)[0]
    assert f"{top_vid}: {top_n:,}" in page  # the flights-per-vehicle chart shows the real count


@pytest.mark.timeout(300)
def test_replay_writes_kpis_chains_and_flight_pages(local_out: tuple[Path, dict[str, Any]], history: History) -> None:
    from tests.analytics.test_flightreport import outline

    out, summary = local_out
    truth = history.truth
    assert summary["kpis"]["flights"] == len(truth.flights)
    assert summary["kpis"]["commands"] == len(truth.commands)
    assert (out / "command_chains" / "_SUCCESS").exists() and (out / "kpis" / "_SUCCESS").exists()
    front = (out / "report.html").read_text()
    o = outline(front)
    assert "Fleet KPIs" in o.headings and "Flight pages" in o.headings
    assert f'data-kpi="flights">{len(truth.flights):,}<' in front
    pages = sorted(p for p in o.links if p.startswith("flight-pages/"))
    # the 10 latest flights, the 10 latest with a failsafe, and every flight of VID-0002
    own = sum(1 for f in truth.flights if f.vid == "VID-0002")
    assert own + 10 <= len(pages) == summary["flight_pages"] <= own + 20
    for href in pages:
        page = (out / href).read_text()
        po = outline(page)
        assert po.headings[1:] == ["Track", "Altitude and battery", "Commands", "Events"], href
        assert po.tags.count("svg") == 3 and 'id="track"' in page and "script" not in po.tags
        assert "../report.html" in po.links
        # one count of positions: the track's caption and the facts agree
        shown = re.search(r"<figcaption>track \(([\d,]+) positions?,", page)
        assert shown is not None and f"<dd data-key=positions>{shown[1]} position" in page, href
        # the flight's mode changes and commands marked on the track and the altitude chart
        assert page.count('id="mark-mode-0"') == 2 and page.count('id="mark-command-0"') == 2, href
    # the top block: labels, not keys; times to the second; latency per result kind; effects in seconds
    assert "<dt>undecodable events</dt>" in front and "<dt>error_rows" not in front and "<dt>total_s" not in front
    assert re.search(r"\d:\d\d\.\d{3,}", front) is None, "a time with fractions of a second"
    assert "<caption>latency by command and result" in front and "<td>accepted</td>" in front
    assert "<th>p50 (s)</th>" in front


def test_cli_arguments() -> None:
    now = dt.datetime(2025, 6, 15, tzinfo=dt.UTC)
    cfg = config_from_args(build_parser().parse_args(["--since", "24h", "--out", "x", "--nats", "nats://127.0.0.1:1"]), now=now)
    assert cfg.start == now - dt.timedelta(hours=24) and cfg.end is None and cfg.master == "local[*]"
    cfg = config_from_args(build_parser().parse_args(
        ["--from", "2025-06-01", "--to", "2025-06-02T00:00:00Z", "--out", "x", "--vid", "VID-1", "--jobs", "flights"]))
    assert cfg.jobs == ("flights", "timeline") and cfg.vids == ("VID-1",)
    assert cfg.source_options()["end_time"].startswith("2025-06-02T00:00:00")
    with pytest.raises(ConfigError):
        config_from_args(build_parser().parse_args(["--out", "x", "--jobs", "nope"]))
    with pytest.raises(ConfigError):
        config_from_args(build_parser().parse_args(["--out", "x", "--vid", "bad.vid"]))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--since", "1h", "--from", "2025-06-01", "--out", "x"])
    assert config_from_args(build_parser().parse_args(["--out", "x", "--driver-memory", "2G"])).driver_memory == "2g"
    with pytest.raises(ConfigError, match="driver_memory"):
        config_from_args(build_parser().parse_args(["--out", "x", "--driver-memory", "lots"]))


def test_spark_conf_sets_driver_memory_and_rejects_nonsense() -> None:
    from mavjet.analytics.session import DEFAULT_DRIVER_MEMORY, spark_conf

    assert spark_conf("local[2]")["spark.driver.memory"] == DEFAULT_DRIVER_MEMORY
    assert spark_conf("local[2]", driver_memory="512m")["spark.driver.memory"] == "512m"
    for bad in ("", "4", "4gb", "-1g", "0g"):
        with pytest.raises(ConfigError, match="memory size"):
            spark_conf("local[2]", driver_memory=bad)


@pytest.mark.slow
# The limit covers the module's fixtures too (history + local replay). Spark
# start-up dominates; on a 2-core machine shared with other test runs (load
# average ~9) the cluster replay alone took ~60-100 s.
@pytest.mark.timeout(600)
def test_standalone_cluster_gives_the_same_results(
    local_out: tuple[Path, dict[str, Any]], history: History, spark: Any, tmp_path: Path
) -> None:
    local, local_summary = local_out
    work = tmp_path / "spark-work"
    work.mkdir()
    cluster = start_standalone(str(work))
    try:
        start, end = _range(history)
        out = tmp_path / "replay-cluster"
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
        proc = subprocess.run(
            [sys.executable, "-m", "mavjet.ops.cli", "replay", "--master", cluster.master_url, "--out", str(out),
             "--nats", history.url, "--env", ENV, "--from", start.isoformat(), "--to", end.isoformat(),
             "--vid", "VID-0002"],
            env=env, capture_output=True, text=True, timeout=400, check=False,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    finally:
        cluster.stop()
    summary = json.loads((out / "summary.json").read_text())
    for key in ("events", "flights", "failsafes", "cmd_results", "vehicles", "error_rows"):
        assert summary[key] == local_summary[key], key
    for name, order in OUTPUTS.items():
        assert parquet_rows(spark, str(out / name), order) == parquet_rows(spark, str(local / name), order), name
    assert "--- timeline VID-0002" in proc.stdout
