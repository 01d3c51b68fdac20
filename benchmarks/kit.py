"""Pieces every `mavjet bench` command shares: percentiles, the simulator
process, and how results are printed and written."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def percentile(values: Sequence[float], q: float, *, scale: float = 1.0, digits: int = 3) -> float | None:
    """The q-quantile (nearest rank) of `values` times `scale`, rounded; None when empty."""
    if not values:
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, int(q * len(s)))] * scale, digits)


def start_sim(vehicles: int, base_port: int, *, speedup: float = 1.0) -> subprocess.Popen[bytes]:
    """`mavjet sim` as a separate process (its own core where there is one)."""
    return subprocess.Popen(
        [sys.executable, "-m", "gateway", "sim", "--vehicles", str(vehicles), "--base-port", str(base_port),
         "--speedup", str(speedup)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
    )


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout_s)


def report(result: dict[str, Any], out: Path, *, width: int = 32) -> None:
    """Print one `key value` line per figure and write the JSON."""
    out.write_text(json.dumps(result, indent=2))
    for k, v in result.items():
        print(f"{k:{width}} {v}")
    print(f"wrote {out}")
