"""Pieces every `mavjet bench` command shares: percentiles, the simulator
process, and how results are printed and written (where: `default_json`)."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mavjet.ops.demo import pick_base_port
from mavjet.ops.natsserver import COLOCATED_GOMAXPROCS, NatsServer
from mavjet.sim.cli import compiled_from_ready
from mavjet.sim.stepmode import in_step_from_env


# argparse types for the benchmarks' options: a bad figure is one usage error (exit 2) before
# anything starts, not a traceback from a nats-server or a simulator half-way up.
def _number(text: str, kind: type[int] | type[float], minimum: float, strict: bool) -> Any:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if not math.isfinite(value) or value < minimum or (strict and value == minimum):
        raise argparse.ArgumentTypeError(f"{text!r}: must be {'>' if strict else '>='} {minimum:g}")
    return value


def positive_int(text: str) -> int:
    return int(_number(text, int, 0, True))


def non_negative_int(text: str) -> int:
    return int(_number(text, int, 0, False))


def positive_float(text: str) -> float:
    return float(_number(text, float, 0.0, True))


def non_negative_float(text: str) -> float:
    return float(_number(text, float, 0.0, False))


def positive_ints(text: str) -> list[int]:
    """A comma-separated list of counts, e.g. `1000,5000,10000`."""
    values = [positive_int(part.strip()) for part in text.split(",") if part.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"{text!r}: expected counts like 1000,5000")
    return values


def process_rss_mib(pid: int) -> float:
    """A process's resident memory (MiB), from /proc (Linux); NaN where it cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def percentile(values: Sequence[float], q: float, *, scale: float = 1.0, digits: int = 3) -> float | None:
    """The q-quantile (nearest rank) of `values` times `scale`, rounded; None when empty."""
    if not values:
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, int(q * len(s)))] * scale, digits)


def percentile_ci(values: Sequence[float], q: float, *, level: float = 0.95,
                  digits: int = 3) -> tuple[float, float] | None:
    """A distribution-free confidence interval for the q-quantile: two order statistics of `values`.

    The count of samples below the true quantile is binomial(n, q), so the `l`-th and `u`-th smallest
    samples bracket it with probability P(l <= B < u): `l` as high and `u` as low as keep each tail
    within (1 - level) / 2 (exact binomial, not the normal approximation, which fails in the tail).
    With 600 commands the p99 is the 6th slowest and its 95 % interval runs from the 12th slowest to
    the 2nd slowest: one run's p99 alone cannot tell 45 ms from 55. None when there are too few
    samples for both ends (fewer than ~370 for a p99).
    """
    n = len(values)
    if n < 2 or not 0.0 < q < 1.0:
        return None
    tail = (1.0 - level) / 2.0
    lq, lp = math.log(q), math.log1p(-q)
    lgn = math.lgamma(n + 1)
    cdf: list[float] = []  # cdf[k] = P(B <= k)
    acc = 0.0
    for k in range(n + 1):
        acc += math.exp(lgn - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * lq + (n - k) * lp)
        cdf.append(acc)
    lows = [j for j in range(1, n + 1) if cdf[j - 1] <= tail]  # P(B < j) <= tail
    highs = [j for j in range(1, n + 1) if 1.0 - cdf[j - 1] <= tail]  # P(B >= j) <= tail
    if not lows or not highs:
        return None
    s = sorted(values)
    return round(s[max(lows) - 1], digits), round(s[min(highs) - 1], digits)


def this_python() -> list[str]:
    """The interpreter for a benchmark's child process, importing as this one does: with `-P` when
    this one runs with it (a compiled copy on PYTHONPATH), so the working directory's sources do
    not come first in the child either."""
    return [sys.executable, "-P"] if sys.flags.safe_path else [sys.executable]


def start_sim(
    vehicles: int, base_port: int, *, speedup: float = 1.0, ready_timeout_s: float = 300.0
) -> subprocess.Popen[bytes]:
    """`mavjet sim` as a separate process (its own core where there is one), returned once
    every vehicle listens: the sim prints `ready vehicles=N` after the last bind. At 1,000
    vehicles on a loaded machine that takes well over a minute, and a benchmark that
    connects earlier is refused.

    It imports what this process imports: started with `-P` (a compiled copy on PYTHONPATH,
    `mavjet compile --target DIR --sim`), the child is too, so the working directory's sources
    do not come first. `sim_compiled_modules` then says how many of its modules run compiled."""
    proc = subprocess.Popen(
        [*this_python(), "-m", "mavjet.ops", "sim", "--vehicles", str(vehicles),
         "--base-port", str(base_port), "--speedup", str(speedup)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )
    out = proc.stdout
    assert out is not None
    ready = threading.Event()
    seen: list[bytes] = []

    def drain() -> None:
        # Reads every line (so a full pipe never blocks the sim) and flags `ready`.
        for line in iter(out.readline, b""):
            if len(seen) < 50:
                seen.append(line)
            if line.startswith(b"ready vehicles="):
                _SIM_COMPILED[proc.pid] = compiled_from_ready(line.decode(errors="replace"))
                ready.set()

    threading.Thread(target=drain, name="sim-stdout", daemon=True).start()
    started = time.monotonic()
    while not ready.wait(0.5):
        if proc.poll() is not None or time.monotonic() - started > ready_timeout_s:
            stop_process(proc)
            tail = b"".join(seen[-5:]).decode(errors="replace")
            raise SystemExit(f"mavjet bench: the simulator did not report ready ({ready_timeout_s:.0f} s):\n{tail}")
    step = "in step" if in_step_from_env() else "out of step"
    compiled = sim_compiled_modules(proc.pid)
    how = f", {compiled} modules compiled" if compiled else ", interpreted"
    print(f"sim ready: {vehicles} vehicles in {time.monotonic() - started:.1f} s ({step}{how})", flush=True)
    return proc


_SIM_COMPILED: dict[int, int] = {}  # the simulator's pid: its compiled modules, from its ready line


def sim_compiled_modules(pid: int) -> int:
    """How many modules of the simulator with this pid run compiled (started by `start_sim`; 0 if unknown)."""
    return _SIM_COMPILED.get(pid, 0)


@contextmanager
def nats_and_sim(
    sim_vehicles: int, *, preferred_port: int, prefix: str = "mavjet-bench-"
) -> Iterator[tuple[NatsServer, subprocess.Popen[bytes], int, str]]:
    """A nats-server in a temporary directory and the simulator with `sim_vehicles`, both stopped
    and the directory removed on the way out: `(server, sim, base_port, tmp_dir)`."""
    tmp = tempfile.TemporaryDirectory(prefix=prefix)
    # The server shares the machine with the simulator and the gateway, as on a small edge hub.
    server = NatsServer(store_dir=f"{tmp.name}/js", gomaxprocs=COLOCATED_GOMAXPROCS)
    sim: subprocess.Popen[bytes] | None = None
    try:
        server.start()
        base = pick_base_port(sim_vehicles, preferred=preferred_port)
        sim = start_sim(sim_vehicles, base)
        yield server, sim, base, tmp.name
    finally:
        if sim is not None:
            stop_process(sim)
        server.cleanup()
        tmp.cleanup()


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout_s)


RESULTS_DIR = Path("benchmarks") / "results"  # inside a checkout: the JSON docs/benchmarks.md cites


def results_dir(cwd: Path | None = None) -> Path | None:
    """`benchmarks/results/` of the mavjet checkout the working directory is in, or None outside one.

    A checkout is a directory holding `pyproject.toml` and `benchmarks/results/README.md`, the
    working directory or one above it (an installed mavjet has neither)."""
    here = (cwd or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / RESULTS_DIR / "README.md").is_file() and (d / "pyproject.toml").is_file():
            return d / RESULTS_DIR
    return None


def default_json(name: str, *, cwd: Path | None = None, now: datetime | None = None) -> Path:
    """Where a benchmark writes its JSON when `--json` is not given: `benchmarks/results/NAME-STAMP.json`
    inside a checkout, `bench-NAME-STAMP.json` in the working directory otherwise; STAMP is the UTC
    time (`20261201T190700Z`), so no run overwrites another's."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    found = results_dir(cwd)
    if found is None:
        return (cwd or Path()) / f"bench-{name}-{stamp}.json"
    return found / f"{name}-{stamp}.json"


def report(result: dict[str, Any], out: Path, *, width: int = 32) -> None:
    """Print one `key value` line per figure and write the JSON (its directory made if missing)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    for k, v in result.items():
        print(f"{k:{width}} {v}")
    print(f"wrote {out}")


def run_json(label: str, cmd: list[str], *, cwd: Path, env: dict[str, str], out: Path) -> dict[str, Any]:
    """Run a benchmark process that writes its report to `out`; return the report (exit with its output's tail on failure)."""
    started = time.monotonic()
    print(f"  {label}: {' '.join(cmd[3:] if cmd[1] == '-c' else cmd[1:])}", flush=True)
    proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0 or not out.exists():
        tail = proc.stdout.decode(errors="replace").strip().splitlines()[-5:]
        raise SystemExit(f"mavjet bench: {label} failed (exit {proc.returncode}):\n" + "\n".join(tail))
    print(f"  {label}: done in {time.monotonic() - started:.0f} s", flush=True)
    report: dict[str, Any] = json.loads(out.read_text())
    return report


@contextmanager
def cpu_hogs(count: int, *, nice: int = 0) -> Iterator[list[subprocess.Popen[bytes]]]:
    """`count` processes that spin for the block's duration: "a loaded machine" (issue 15, goal 5),
    the same load for every side of a comparison. Each is one busy Python loop.

    `nice` lowers their scheduling weight against mavjet's processes (nice 0): the CFS weight
    that systemd's `CPUWeight=` or a container's `cpu_shares` sets for a whole service, here
    per process and without root (nice 7 weighs 215 against nice 0's 1024)."""
    code = f"import os\nos.nice({int(nice)})\nwhile True: pass" if nice else "while True: pass"
    procs = [subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL)
             for _ in range(max(0, count))]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()
