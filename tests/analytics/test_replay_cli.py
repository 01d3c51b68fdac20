"""`mavjet replay` as a user sees it: stage lines while it runs, one line when NATS is unreachable."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from mavjet.analytics.progress import SparkTicker
from mavjet.analytics.replay import LineProgress, error_line
from mavjet.ops.natsserver import free_port


def test_unreachable_nats_is_one_line_and_exit_2(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "mavjet.ops.cli", "replay", "--since", "1h", "--out", str(tmp_path / "out"),
         "--nats", f"nats://127.0.0.1:{port}", "--env", "test"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert time.monotonic() - t0 < 60
    assert "Traceback" not in proc.stderr and "py4j" not in proc.stderr.lower()
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("mavjet replay: jetstream source TWIN_EVENTS: cannot connect to "), proc.stderr
    assert f"127.0.0.1:{port}" in last
    assert not (tmp_path / "out").exists()  # Spark never started


def test_stage_lines() -> None:
    buf = io.StringIO()
    p = LineProgress(buf)
    p.stage("reading events from NATS")
    p.done("read", 29.94, "1,000,000 events")
    assert buf.getvalue().splitlines() == [
        "mavjet replay: reading events from NATS ...",
        "mavjet replay: read done in 29.9 s: 1,000,000 events",
    ]


def test_a_long_stage_reports_its_tasks_while_it_runs(spark: Any) -> None:
    buf = io.StringIO()
    p = LineProgress(buf)
    p.stage("reading events from NATS")

    def slow(x: int) -> int:
        import time as t

        t.sleep(0.4)
        return x

    with SparkTicker(spark, p.tick, every_s=0.1):
        assert sorted(spark.sparkContext.parallelize(range(6), 6).map(slow).collect()) == list(range(6))
    ticks = buf.getvalue().splitlines()[1:]
    assert ticks, "no progress line while the job ran"
    assert all(t.startswith("mavjet replay: reading events from NATS: ") for t in ticks)
    assert any("/6 tasks of the running Spark stages" in t for t in ticks)
    n = len(buf.getvalue().splitlines())
    time.sleep(0.3)
    assert len(buf.getvalue().splitlines()) == n  # the ticker stopped with the block


def test_error_line_digs_the_source_error_out_of_a_spark_trace() -> None:
    trace = (
        "An error occurred while calling o52.count.\n: org.apache.spark.SparkException: Job aborted\n"
        "  File \"/x/worker.py\", line 1\n"
        "mavjet.analytics.natsread.SourceError: jetstream source TWIN_EVENTS: no message for 30.0 s at seq 17\n"
        "\tat org.apache.spark.api.python...\n"
    )
    assert error_line(RuntimeError(trace)) == "jetstream source TWIN_EVENTS: no message for 30.0 s at seq 17"
    assert error_line(ValueError("bad\nmore")) == "ValueError: bad"
