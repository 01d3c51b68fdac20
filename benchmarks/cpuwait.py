"""How long the benchmark's processes waited for a CPU: Linux's schedstat and pressure stall info.

A slow hour on these shared 2-core machines shows as the same work taking
more CPU (docs/benchmarks.md) and, for latency, as time a process was ready
to run and had no core: every hop of a command through the issuer,
nats-server, the gateway's event loop and the simulator may add such a wait.
A run's report says how much of it there was, so a tail can be told from a
regression of the code:

- `<proc>_cpu_wait_pct`: the share of the window the process's main thread
  (the gateway's and the simulator's event loop) was runnable but not
  running; for nats-server, all its threads together (Go spreads its work
  over them), so it can exceed 100.
- `<proc>_cpu_wait_ms`: that wait per time it got a CPU (per timeslice),
  the mean wait a wake-up paid before it ran.
- `cpu_pressure_pct`: the machine's PSI "some" for CPU, the share of the
  window in which at least one task waited for a CPU.

Figures are None where the kernel does not provide them (another OS, a
kernel without schedstat or PSI, a process that ended in the window).
Read from /proc, not psutil: three numbers per file, and psutil exposes
neither the run-queue wait nor PSI.
"""

from __future__ import annotations

import glob
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_NAN = float("nan")


@dataclass(frozen=True, slots=True)
class SchedTimes:
    on_cpu_s: float
    waiting_s: float
    timeslices: int


def sched_times(pid: int, *, all_threads: bool = False) -> SchedTimes | None:
    """The main thread's schedstat (or the sum of every thread's), None where unreadable."""
    paths = glob.glob(f"/proc/{pid}/task/*/schedstat") if all_threads else [f"/proc/{pid}/schedstat"]
    run_ns = wait_ns = slices = 0
    read = 0
    for path in paths:
        try:
            with open(path) as f:
                a, b, c = f.read().split()[:3]
        except (OSError, ValueError):
            continue
        run_ns, wait_ns, slices, read = run_ns + int(a), wait_ns + int(b), slices + int(c), read + 1
    if not read:
        return None
    return SchedTimes(run_ns / 1e9, wait_ns / 1e9, slices)


def cpu_pressure_s() -> float:
    """PSI "some" total for CPU in seconds since boot (NaN without /proc/pressure/cpu)."""
    try:
        with open("/proc/pressure/cpu") as f:
            first = f.readline()
        return int(first.rsplit("total=", 1)[1]) / 1e6
    except (OSError, IndexError, ValueError):
        return _NAN


@dataclass(frozen=True, slots=True)
class Snapshot:
    at_s: float
    procs: Mapping[str, SchedTimes | None]
    pressure_s: float


def snapshot(pids: Mapping[str, Sequence[int]], *, all_threads: Sequence[str] = ("nats",)) -> Snapshot:
    """Each named group of processes' schedstat, summed, and the machine's CPU pressure, now."""
    procs: dict[str, SchedTimes | None] = {}
    for name, group in pids.items():
        parts = [sched_times(p, all_threads=name in all_threads) for p in group]
        if not group or any(p is None for p in parts):
            procs[name] = None
            continue
        procs[name] = SchedTimes(sum(p.on_cpu_s for p in parts if p), sum(p.waiting_s for p in parts if p),
                                 sum(p.timeslices for p in parts if p))
    return Snapshot(time.monotonic(), procs, cpu_pressure_s())


def report(before: Snapshot, after: Snapshot) -> dict[str, float | None]:
    """`<name>_cpu_wait_pct`, `<name>_cpu_wait_ms` and `cpu_pressure_pct` over the window between two snapshots."""
    wall = after.at_s - before.at_s
    out: dict[str, float | None] = {}
    for name, b in before.procs.items():
        a = after.procs.get(name)
        pct = ms = None
        # A thread that ended in the window takes its counts with it: a smaller total is no figure.
        if a is not None and b is not None and wall > 0 and a.waiting_s >= b.waiting_s and a.timeslices >= b.timeslices:
            waited = a.waiting_s - b.waiting_s
            pct = round(100 * waited / wall, 1)
            slices = a.timeslices - b.timeslices
            ms = round(1000 * waited / slices, 3) if slices else None
        out[f"{name}_cpu_wait_pct"] = pct
        out[f"{name}_cpu_wait_ms"] = ms
    pressure = after.pressure_s - before.pressure_s
    out["cpu_pressure_pct"] = round(100 * pressure / wall, 1) if wall > 0 and not math.isnan(pressure) else None
    return out
