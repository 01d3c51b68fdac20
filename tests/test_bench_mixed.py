"""`mavjet bench mixed`: end to end on a tiny fleet, the gateway as its own process (the default)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mavjet.benchmarks.commands import open_loop
from mavjet.benchmarks.kit import cpu_hogs, percentile, percentile_ci
from mavjet.benchmarks.workers import log_tail, stop_gateway

ROOT = Path(__file__).resolve().parent.parent


def test_mixed_measures_commands_from_outside_the_gateway_and_the_state_it_stored(tmp_path: Path) -> None:
    out = tmp_path / "mixed.json"
    proc = subprocess.run(
        [sys.executable, "-m", "mavjet.ops", "bench", "mixed", "--vehicles", "3", "--cmd-rate", "4",
         "--duration", "2", "--warmup", "0.5", "--scrape-every", "0.5", "--uvloop", "--cpu-hog", "1",
         "--hog-nice", "15", "--json", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=180, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["gateway"] == "own process" and res["gateway_uvloop"] is True and res["arrivals"] == "even"
    assert res["cpu_hog"] == 1 and res["hog_nice"] == 15
    # The gateway's own drain and close at SIGTERM is info (`nats_closed`), not a warning to chase.
    assert "nats_disconnected" not in res["gateway_warnings"], res["gateway_warnings"]
    cmds, base = res["commands"], res["baseline_jetstream_roundtrip"]
    # Open loop at 4/s for 2 s: 8 commands, each ended with exactly one result, all accepted.
    assert cmds["count"] == 8 and cmds["results"] == {"accepted": 8}
    assert base["count"] == 8 and base["errors"] == {}
    assert 0 < cmds["p50_ms"] <= cmds["p99_ms"] and res["ratio_latency_p99"] > 0
    assert "p99_ci95_ms" in cmds and cmds["p99_ci95_ms"] is None, cmds  # 8 commands: too few for the p99's interval
    # The gateway's split of a command's time, read from its phase histogram (bucket bounds in ms).
    phases = [res[f"gateway_phase_{ph}_ms"] for ph in ("queue", "ledger", "vehicle", "result")]
    assert all(p["p50_le"] is not None and 0 < p["p50_le"] <= p["p99_le"] for p in phases), phases
    # The gateway's loop lag probe (absent in older builds) ran through the window.
    lag = res["gateway_loop_lag_ms"]
    assert lag["p50_le"] is not None and lag["p50_le"] <= lag["p99_le"], lag
    # Each command split at its cmd_result's stamp: both parts measured, and within the whole.
    for part in ("issued_to_result_ms", "result_to_issuer_ms"):
        assert cmds[part]["p50"] is not None and 0 <= cmds[part]["p50"] <= cmds[part]["p99"] <= cmds["max_ms"], cmds
    # State counted from TWIN_STATE's sequence: 3 vehicles at the configured rates were stored.
    assert res["state_stored_per_s"] > 0 and res["state_delivered_ratio"] > 0.5
    # How long each process waited for a CPU in the window (benchmarks/cpuwait.py), where Linux says.
    if Path("/proc/self/schedstat").exists():
        for proc in ("gateway", "sim", "nats"):
            assert res[f"{proc}_cpu_wait_pct"] is not None and res[f"{proc}_cpu_wait_pct"] >= 0, res
    # /metrics scraped during the window, as Prometheus would: every 0.5 s for 2 s.
    assert 3 <= res["scrapes"]["count"] <= 5 and 0 < res["scrapes"]["p50_ms"] <= res["scrapes"]["max_ms"]


def test_cpu_hogs_spin_at_the_nice_value_asked_and_are_gone_after() -> None:
    with cpu_hogs(2, nice=7) as procs:
        assert len(procs) == 2
        deadline = time.monotonic() + 20
        # each sets its own nice first thing; bounded wait for both interpreters to start
        while time.monotonic() < deadline and any(os.getpriority(os.PRIO_PROCESS, p.pid) != 7 for p in procs):
            time.sleep(0.05)
        assert [os.getpriority(os.PRIO_PROCESS, p.pid) for p in procs] == [7, 7]
        assert all(p.poll() is None for p in procs)
    assert all(p.poll() is not None for p in procs)


def test_mixed_refuses_a_bad_hog_nice() -> None:
    proc = subprocess.run([sys.executable, "-m", "mavjet.ops", "bench", "mixed", "--hog-nice", "20"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and proc.stderr.splitlines()[-1].endswith("--hog-nice: '20': nice values go up to 19")


def test_mixed_refuses_a_negative_scrape_period() -> None:
    proc = subprocess.run([sys.executable, "-m", "mavjet.ops", "bench", "mixed", "--scrape-every", "-1"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "--scrape-every" in proc.stderr


def test_mixed_refuses_scraping_a_gateway_in_process() -> None:
    proc = subprocess.run([sys.executable, "-m", "mavjet.ops", "bench", "mixed", "--scrape-every", "1", "--in-process"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "--in-process" in proc.stderr.splitlines()[-1]


def test_mixed_refuses_uvloop_for_a_gateway_in_process() -> None:
    proc = subprocess.run([sys.executable, "-m", "mavjet.ops", "bench", "mixed", "--uvloop", "--in-process"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "--uvloop" in proc.stderr


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="needs a git checkout")
def test_mixed_runs_the_gateway_of_another_build(tmp_path: Path) -> None:
    """--gateway-ref: the same benchmark around the gateway of a git ref (today's code against the new)."""
    out = tmp_path / "mixed-ref.json"
    # The worktree goes under this test's own temporary dir: another test's comparison may
    # hold a worktree of its own meanwhile (make test runs two pytests side by side).
    own_tmp = tmp_path / "tmp"
    own_tmp.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "mavjet.ops", "bench", "mixed", "--vehicles", "2", "--cmd-rate", "4",
         "--duration", "1", "--warmup", "0.5", "--gateway-ref", "HEAD", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=180, check=False, env={**os.environ, "TMPDIR": str(own_tmp)},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["gateway_build"].startswith("HEAD (") and res["commands"]["results"] == {"accepted": 4}
    assert res["hot_modules_compiled"] == 0  # a ref's tree runs interpreted
    listed = subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert str(own_tmp) not in listed and not list(own_tmp.iterdir())  # the temporary worktree is gone


async def starts_of(rate_hz: float, seconds: float, seed: int | None) -> list[float]:
    starts: list[float] = []

    async def fire(i: int) -> None:
        starts.append(time.monotonic())

    await open_loop(rate_hz, seconds, fire, poisson_seed=seed)
    return starts


async def test_open_loop_even_and_poisson_schedules() -> None:
    """Even: one start every 1/rate s. Poisson: the seeded schedule's count, with uneven gaps."""
    assert len(await starts_of(200.0, 0.3, None)) == 60
    starts = await starts_of(200.0, 0.3, 7)
    rng, expected, t = random.Random(7), 0, 0.0
    for _ in range(10_000):  # bounded: ~60 arrivals
        t += rng.expovariate(200.0)
        if t >= 0.3:
            break
        expected += 1
    assert len(starts) == expected and expected != 60
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert max(gaps) > 4 * min(gaps), gaps


def test_mixed_refuses_an_unknown_arrival_process() -> None:
    proc = subprocess.run([sys.executable, "-m", "mavjet.ops", "bench", "mixed", "--arrivals", "bursty"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "--arrivals" in proc.stderr


def test_the_p99s_interval_brackets_it_with_the_order_statistics_the_binomial_allows() -> None:
    values = [float(i) for i in range(600)]  # 0 .. 599 ms, the 600 commands of a 60-s run at 10/s
    random.Random(1).shuffle(values)
    assert percentile(values, 0.99) == 594.0
    # Bin(600, 0.99): P(B < 589) = 0.020 and P(B >= 599) = 0.017 are the widest tails within 2.5 %
    # (one rank further, 0.042 and 0.061): the 12th slowest to the 2nd slowest.
    assert percentile_ci(values, 0.99) == (588.0, 598.0)
    assert percentile_ci(values, 0.5) == (275.0, 324.0)
    assert percentile_ci([float(i) for i in range(370)], 0.99) == (361.0, 369.0)
    # Too few samples for the upper end: no interval rather than a false one.
    assert percentile_ci([float(i) for i in range(360)], 0.99) is None
    assert percentile_ci([5.0], 0.99) is None and percentile_ci([], 0.5) is None


def test_the_interval_covers_the_true_quantile_as_often_as_it_says() -> None:
    """Uniform samples on [0, 1), whose q-quantile is q: the 95 % interval holds it in ~95 % of runs."""
    rng = random.Random(7)
    for q, n in ((0.99, 600), (0.5, 101)):
        covered = 0
        for _ in range(400):  # bounded
            ci = percentile_ci([rng.random() for _ in range(n)], q, digits=9)
            assert ci is not None
            covered += ci[0] <= q <= ci[1]
        assert 0.93 * 400 <= covered <= 0.995 * 400, (q, covered)


def test_a_run_whose_tail_moved_shows_it_in_the_interval() -> None:
    """Two runs with the same p99 but a different spread of the slowest commands: the intervals differ."""
    calm = [10.0] * 580 + [40.0] * 20
    spiky = [10.0] * 580 + [40.0] * 15 + [200.0] * 5
    assert percentile(calm, 0.99) == percentile(spiky, 0.99) == 40.0
    assert percentile_ci(calm, 0.99) == (40.0, 40.0)
    assert percentile_ci(spiky, 0.99) == (40.0, 200.0)


async def test_stopping_a_gateway_that_already_exited_keeps_its_error(tmp_path: Path) -> None:
    """A gateway that failed at start is gone before the benchmark's cleanup: no ProcessLookupError over
    the reason, which the benchmark's message carries from the gateway's log."""
    log = tmp_path / "gateway.log"
    with log.open("wb") as f:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import sys; print('ImportError: no module named mavjet.gateway.stores.recorder', file=sys.stderr);"
            " sys.exit(1)", stdout=subprocess.DEVNULL, stderr=f)
    assert await proc.wait() == 1
    await stop_gateway(proc)  # raised ProcessLookupError before
    assert proc.returncode == 1
    assert log_tail(log) == "ImportError: no module named mavjet.gateway.stores.recorder"
    assert log_tail(tmp_path / "empty.log").startswith("(its log ")
    (tmp_path / "blank.log").write_text("\n\n")
    assert log_tail(tmp_path / "blank.log") == "(it wrote nothing)"
    many = tmp_path / "many.log"
    many.write_text("".join(f"line {i}\n" for i in range(10)))
    assert log_tail(many) == "line 7 | line 8 | line 9"


_SITE_PROBE = """\
import os, sys
with open(os.environ["MAVJET_TEST_PROBE"], "a") as f:
    f.write(f"{int(sys.flags.safe_path)} {' '.join(sys.orig_argv[1:])}\\n")
"""


@pytest.mark.parametrize("bench", [
    ["mixed", "--vehicles", "2", "--cmd-rate", "2", "--duration", "1", "--warmup", "0.5"],
    ["ingest", "--vehicles", "2", "--duration", "1", "--warmup", "0.5", "--workers", "1"],
])
def test_a_benchmark_run_with_P_starts_its_gateway_with_P(tmp_path: Path, bench: list[str]) -> None:
    """Run from a compiled copy (`PYTHONPATH=DIR python -P ...`) in the checkout, the gateway a benchmark
    starts as its own process must import that copy too. Without -P its `-c`/`-m` put the checkout's
    sources first: `bench compare --new-compiled -- mixed` (its working directory the checkout) so
    measured an interpreted gateway while the report said compiled."""
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "sitecustomize.py").write_text(_SITE_PROBE)  # every Python process records its -P and argv
    seen = tmp_path / "seen.txt"
    proc = subprocess.run(
        [sys.executable, "-P", "-m", "mavjet.ops", "bench", *bench, "--json", str(tmp_path / "out.json")],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(probe), "MAVJET_TEST_PROBE": str(seen)},
        capture_output=True, text=True, timeout=180, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = seen.read_text().splitlines()
    gateways = [ln for ln in lines if "--config" in ln.split()]  # only the gateway is started with a config file
    assert gateways, lines  # the gateway process(es) the benchmark started were seen
    assert all(ln.startswith("1 ") for ln in lines), lines  # and it, like every child, ran with -P
