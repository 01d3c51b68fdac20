"""`mavjet bench scrape`: both pages served and timed, and they hold the same series."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_scrape_bench_serves_both_pages_with_the_same_series(tmp_path: Path) -> None:
    out = tmp_path / "scrape.json"
    proc = subprocess.run([sys.executable, "-m", "mavjet.ops", "bench", "scrape", "--vehicles", "7", "--rounds", "2",
                           "--json", str(out)], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(out.read_text())
    for fmt in ("openmetrics", "text"):
        served, baseline = res[f"served.{fmt}"], res[f"baseline.{fmt}"]
        assert served["lines"] == baseline["lines"] > 7 * 6  # six per-vehicle families, and the rest
        assert served["p50_ms"] > 0 and baseline["p50_ms"] > 0
        assert res[f"ratio_p50.{fmt}"] is not None
    assert "ratio_p50.openmetrics" in proc.stdout


def test_bad_arguments_exit_2() -> None:
    proc = subprocess.run([sys.executable, "-m", "mavjet.ops", "bench", "scrape", "--vehicles", "0"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "--vehicles" in proc.stderr


def test_every_benchmark_is_listed_in_help_and_readme() -> None:
    from mavjet.benchmarks.cli import BENCHMARKS

    helptext = subprocess.run([sys.executable, "-m", "mavjet.ops", "--help"], capture_output=True, text=True,
                              timeout=60, check=True).stdout
    line = next(ln for ln in helptext.splitlines() if ln.strip().startswith("bench"))
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    row = next(ln for ln in readme.splitlines() if ln.startswith("| `mavjet bench "))
    for name in BENCHMARKS:
        assert name in line, name
        assert name in row, name
