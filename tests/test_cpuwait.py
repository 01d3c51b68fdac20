"""benchmarks/cpuwait.py: run-queue waits read from the kernel, on real processes sharing one core."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mavjet.benchmarks import cpuwait

pytestmark = pytest.mark.skipif(not Path("/proc/self/schedstat").exists(), reason="needs Linux schedstat")


def _burn(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_the_main_threads_cpu_time_grows_with_the_work_it_does() -> None:
    before = cpuwait.sched_times(os.getpid())
    _burn(0.05)
    after = cpuwait.sched_times(os.getpid())
    assert before is not None and after is not None
    assert after.on_cpu_s - before.on_cpu_s >= 0.04
    assert after.waiting_s >= before.waiting_s and after.timeslices >= before.timeslices
    assert cpuwait.sched_times(2**22 + 12345) is None  # no such process


def test_two_spinners_on_one_core_each_wait_about_half_the_time() -> None:
    core = min(os.sched_getaffinity(0))
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
                for _ in range(2)]
    try:
        for p in spinners:
            os.sched_setaffinity(p.pid, {core})
        time.sleep(0.2)  # both started and spinning
        pids = {"a": [spinners[0].pid], "b": [spinners[1].pid]}
        before = cpuwait.snapshot(pids)
        time.sleep(1.0)
        figures = cpuwait.report(before, cpuwait.snapshot(pids))
    finally:
        for p in spinners:
            p.kill()
            p.wait(timeout=10)
    # One core, two always-runnable processes: each waits while the other runs (~50 % each; other
    # work on that core only adds to it).
    for name in ("a", "b"):
        pct, ms = figures[f"{name}_cpu_wait_pct"], figures[f"{name}_cpu_wait_ms"]
        assert pct is not None and 25 <= pct <= 100, figures
        assert ms is not None and ms > 0, figures
    if Path("/proc/pressure/cpu").exists():
        pressure = figures["cpu_pressure_pct"]
        assert pressure is not None and pressure >= 25, figures


def test_report_gives_no_figure_where_counts_are_missing_or_shrank() -> None:
    t = cpuwait.SchedTimes
    before = cpuwait.Snapshot(10.0, {"gw": t(1.0, 0.5, 100), "sim": t(1.0, 0.5, 100), "gone": None}, 100.0)
    after = cpuwait.Snapshot(12.0, {"gw": t(2.0, 0.7, 300), "sim": t(1.5, 0.4, 150), "gone": None}, 100.5)
    out = cpuwait.report(before, after)
    assert out["gw_cpu_wait_pct"] == 10.0 and out["gw_cpu_wait_ms"] == 1.0  # 0.2 s of 2 s; 0.2 s over 200 slices
    assert out["sim_cpu_wait_pct"] is None and out["sim_cpu_wait_ms"] is None  # a thread ended: counts shrank
    assert out["gone_cpu_wait_pct"] is None
    assert out["cpu_pressure_pct"] == 25.0
    no_psi = cpuwait.report(before, cpuwait.Snapshot(12.0, after.procs, float("nan")))
    assert no_psi["cpu_pressure_pct"] is None
