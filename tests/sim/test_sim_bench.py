"""`mavjet sim bench`, end to end on a tiny fleet: it measures the simulator it says it measures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def sim_bench(tmp_path: Path, *python: str, env: dict[str, str] | None = None) -> dict[str, object]:
    proc = subprocess.run([*python, "-m", "gateway", "sim", "bench", "-n", "2", "--duration", "1", "--warmup", "0.5"],
                          capture_output=True, text=True, timeout=90, cwd=tmp_path, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.timeout(120)
def test_the_source_checkouts_simulator_is_measured_interpreted(tmp_path: Path) -> None:
    result = sim_bench(tmp_path, sys.executable)
    assert result["vehicles"] == 2 and result["crc_errors"] == 0
    assert isinstance(result["sim_msgs_per_s"], float) and result["sim_msgs_per_s"] > 0
    assert result["sim_modules_compiled"] == 0
