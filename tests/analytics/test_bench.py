"""`mavjet bench replay` on a small stream: every stage runs, reports as it goes, and counts add up."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mavjet.benchmarks import replay as bench
from mavjet.ops.natsserver import NatsServer


# the end-to-end stage starts `mavjet replay` in a process of its own: a second JVM
@pytest.mark.timeout(300)
def test_bench_reports_each_stage_and_reads_every_event(spark: Any, tmp_path: Path) -> None:
    seen: list[tuple[str, bool, str]] = []

    def on_stage(name: str, res: dict[str, Any]) -> None:
        seen.append((name, res["complete"], bench._line(name, res)))

    with NatsServer(store_dir=str(tmp_path / "js"), log_file=str(tmp_path / "nats.log")) as srv:
        res = bench.run(
            srv.url, 3_000, seed=3, master="local[2]", out_dir=str(tmp_path / "out"), partitions=2,
            on_stage=on_stage, spark=spark,
        )
    assert [s[0] for s in seen] == ["fill", "ceiling_callback", "ceiling_decode", "source", "replay"]
    # only the last stage says the run is complete: a run that dies keeps 'complete: false'
    assert [s[1] for s in seen] == [False, False, False, False, True]
    n = res["fill"]["stream_messages"]
    assert n == res["fill"]["published"] == 3_000
    assert res["replay_events"] == n and res["read_partitions"] == 2
    assert res["source_events_per_s"] > 0 and res["ratio_source_to_decode_ceiling"] > 0
    assert "3,000" in seen[0][2] and "2 partitions" in seen[3][2]
    # end to end = the replay process's whole life: its Spark start and its jobs
    assert res["end_to_end_s"] > res["replay_s"] > 0 and res["replay_start_s"] > 0
    assert "end to end" in seen[4][2] and "3,000 events" in seen[4][2]
    # whether the replay's JVM mapped the class-data archive or recorded it is part of the figure
    assert res["jvm_class_archive"] in {"used", "recorded", "off"}
    assert f"JVM class archive {res['jvm_class_archive']}" in seen[4][2]
    assert spark.range(3).count() == 3  # a session passed in is left running
