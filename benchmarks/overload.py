"""`mavjet bench overload`: the knee of the ingest benchmark, then twice the fleet, in one run.

Issue 15's goal 5 (graceful overload): at twice the sustainable fleet size the
gateway delivers at least 90 % of the state rate measured at the knee, with a
p99 of delivered samples under 1 s, no event lost and the NATS connection kept.
Both sides of that ratio must come from the same run (these machines' speed
varies up to 3x between hours), so this finds the knee first and then runs
twice its size, under the same `--cpu-hog` load throughout.

Each point is one `mavjet bench ingest` process (its own nats-server and sim).
The knee is the largest of `--sizes`, tried in order, whose stored state rate
is at least 98 % of the configured rate; the search stops at the first size
below that.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mavjet.benchmarks.kit import (
    cpu_hogs,
    default_json,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_ints,
    report,
    run_json,
    this_python,
)

SUSTAINED = 0.98  # of the configured state rate: goal 2's bar for "sustained"
GOALS = {"delivered_of_knee": 0.90, "latency_ms_p99": 1000.0}


def delivered_ratio(point: dict[str, Any]) -> float:
    expected = float(point.get("state_expected_per_s") or 0.0)
    return float(point["state_msgs_per_s"]) / expected if expected else 0.0


def knee(points: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The last point of an ascending search that still sustained its configured rate (None: not even the first)."""
    best = None
    for p in points:
        if delivered_ratio(p) < SUSTAINED:
            break
        best = p
    return best


def verdict(at_knee: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Goal 5's figures and each promise kept or not, from the knee's run and the overloaded one."""
    capacity = float(at_knee["state_msgs_per_s"])
    of_knee = float(over["state_msgs_per_s"]) / capacity if capacity else 0.0
    p99 = over.get("latency_ms_p99")
    duration = float(over.get("duration_s") or 1.0)
    return {
        "knee_vehicles": at_knee["vehicles"], "knee_state_per_s": capacity,
        "overload_vehicles": over["vehicles"], "overload_state_per_s": over["state_msgs_per_s"],
        "overload_state_expected_per_s": over["state_expected_per_s"],
        "delivered_of_knee": round(of_knee, 3),
        "overload_latency_ms_p50": over.get("latency_ms_p50"), "overload_latency_ms_p99": p99,
        "overload_gateway_cpu_pct": over.get("gateway_cpu_pct"),
        # The simulator shares the cores: at twice the knee it takes most of one (docs/benchmarks.md).
        "overload_sim_cpu_pct": over.get("sim_cpu_pct"),
        "overload_state_superseded_per_s": round(float(over.get("state_superseded", 0)) / duration, 1),
        "overload_state_shed": over.get("state_shed"),
        "events_enqueued": over.get("events_enqueued"), "events_lost": over.get("events_lost"),
        "nats_reconnects": over.get("nats_reconnects"),
        "goals": {
            "delivered_ge_90pct_of_knee": of_knee >= GOALS["delivered_of_knee"],
            "p99_under_1s": p99 is not None and float(p99) < GOALS["latency_ms_p99"],
            "no_event_lost": over.get("events_lost") == 0,
            "nats_connection_kept": over.get("nats_reconnects") == 0 and bool(over.get("nats_connected_at_end")),
        },
    }


def _point(n: int, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    out = tmp / f"ingest-{n}.json"
    cmd = [*this_python(), "-m", "mavjet.ops", "bench", "ingest", "--vehicles", str(n), "--duration", str(args.duration),
           "--warmup", str(args.warmup), "--baseline-seconds", "1", *(["--shaping"] if args.shaping else []),
           "--json", str(out)]
    res = run_json(f"{n} vehicles", cmd, cwd=Path.cwd(), env=dict(os.environ), out=out)
    print(f"  {n} vehicles: {res['state_msgs_per_s']:.0f} of {res['state_expected_per_s']:.0f} state/s "
          f"({100 * delivered_ratio(res):.1f} %), p99 {res['latency_ms_p99']} ms, gateway CPU {res['gateway_cpu_pct']} %, "
          f"simulator {res.get('sim_cpu_pct')} %",
          flush=True)
    return res


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mavjet bench overload", description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--sizes", type=positive_ints, default="500,1000,1500", help="fleet sizes tried for the knee, ascending "
                   "(default %(default)s)")
    p.add_argument("--factor", type=float, default=2.0, help="the overloaded run's size, times the knee's "
                   "(default %(default)s)")
    p.add_argument("--duration", type=positive_float, default=15.0, help="each run's measurement window, seconds")
    p.add_argument("--warmup", type=non_negative_float, default=5.0, help="seconds after startup before measuring")
    p.add_argument("--cpu-hog", type=non_negative_int, default=0, metavar="K", help="K busy processes load the machine "
                   "for the whole run (overload on a loaded machine)")
    p.add_argument("--shaping", action="store_true", help="the uplink shaper on, as `mavjet gateway` runs by default")
    p.add_argument("--json", type=Path, default=None, help="write results here "
                   "(default: benchmarks/results/overload-STAMP.json in a checkout, docs/benchmarks.md)")
    return p


def main(argv: list[str]) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    sizes: list[int] = args.sizes  # positive counts (the option's type)
    if sizes != sorted(sizes) or args.factor <= 1.0:
        p.error("--sizes must be ascending, --factor above 1")
    points: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mavjet-overload-") as tmp, cpu_hogs(args.cpu_hog):
        print(f"knee search: {sizes} vehicles, {args.cpu_hog} busy process(es) alongside", flush=True)
        for n in sizes:
            points.append(_point(n, args, Path(tmp)))
            if delivered_ratio(points[-1]) < SUSTAINED:
                break
        at_knee = knee(points)
        if at_knee is None:
            print(f"mavjet bench overload: {sizes[0]} vehicles already fall below {SUSTAINED:.0%} of the "
                  "configured rate; try smaller --sizes", file=sys.stderr)
            return 1
        n_over = round(args.factor * at_knee["vehicles"])
        print(f"knee: {at_knee['vehicles']} vehicles; overload run: {n_over}", flush=True)
        over = _point(n_over, args, Path(tmp))
    result = verdict(at_knee, over)
    result.update({"cpu_hog": args.cpu_hog, "shaping": args.shaping, "factor": args.factor,
                   "knee_search": [{k: pt.get(k) for k in ("vehicles", "state_msgs_per_s", "state_expected_per_s",
                                                           "latency_ms_p99", "gateway_cpu_pct", "sim_cpu_pct")}
                                   for pt in points]})
    if at_knee is points[-1]:
        result["knee_note"] = "the largest size tried was sustained: the true knee may be higher"
    report(result, args.json or default_json("overload"), width=34)
    return 0
