"""`mavjet twin VID`: a vehicle's current state and its last events.

Every channel shows its age (the reader's clock minus the gateway's receive
time) and the twin is marked stale by the one rule in
`mavjet.ops.read.staleness`; `--json` has top-level `stale`, `age_s` (of the
newest vehicle sample), `stale_reason` and `gateway_age_s`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from typing import Any

from mavjet.contract import natsconn
from mavjet.contract.subjects import EVENTS_STREAM, STATE_CHANNELS, STATE_STREAM, check_token
from mavjet.contract.units import parse_duration_s
from mavjet.ops import resolve
from mavjet.ops.console import console, is_tty, rich_table
from mavjet.ops.fmt import format_fields
from mavjet.ops.read import (
    STALE_AFTER_S,
    Record,
    age_s,
    events_since,
    format_event,
    staleness,
)
from mavjet.ops.resolve import connect
from mavjet.ops.runner import run_cli


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mavjet twin", description="Print a vehicle's current state and last events.")
    p.add_argument("vid", help="vehicle id, e.g. VID-001")
    p.add_argument("--events", type=int, default=10, help="how many recent events to show (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--stale-after", default=f"{STALE_AFTER_S:g}s", type=parse_duration_s, metavar="DURATION",
                   help="mark the twin stale when its newest sample is older than this (default: %(default)s)")
    natsconn.add_nats_arguments(p)
    return p


async def run(args: argparse.Namespace) -> int:
    check_token("vid", args.vid)
    nc = await connect(args, name="mavjet-twin")
    try:
        vehicle = await resolve.vehicle(nc, args.env, args.vid, needs=(STATE_STREAM, EVENTS_STREAM))
        js = nc.jetstream()
        state = {(args.vid, ch): r for ch, r in vehicle.state.items()}
        events = await events_since(js, args.env, vid=args.vid, last=args.events)
    finally:
        await nc.close()
    if not state and not events:
        print(f"mavjet twin: no twin data for {args.vid} in env {args.env!r}", file=sys.stderr)
        return 1
    now = dt.datetime.now(dt.UTC)
    fresh = staleness({ch: r for (_, ch), r in state.items()}, now, args.stale_after)
    if args.json:
        doc: dict[str, Any] = {
            "vid": args.vid,
            "stale": fresh.stale,
            "age_s": _round(fresh.age_s),
            "stale_reason": fresh.reason,
            "gateway_age_s": _round(fresh.gateway_age_s),
            "state": {ch: {"time": r.time.isoformat(), "age_s": _round(age_s(r.time, now)), **r.data}
                      for (_, ch), r in sorted(state.items())},
            "events": [{"type": e.kind, "time": e.time.isoformat(), **e.data} for e in events],
        }
        print(json.dumps(doc, indent=2, default=str))
        return 0
    age = "no samples" if fresh.age_s is None else f"newest sample {fresh.age_s:.1f} s old"
    if is_tty():
        _print_rich(args, state, events, now=now, stale=fresh.stale, reason=fresh.reason, age=age)
        return 0
    print(f"{args.vid} ({args.env})  " + (f"STALE: {fresh.reason} ({age})" if fresh.stale else f"live ({age})"))
    for ch in STATE_CHANNELS:
        r = state.get((args.vid, ch))
        if r is None:
            continue
        fields = format_fields(r.data)
        print(f"  {ch:<9} {r.time:%H:%M:%S.%f}"[:-3] + f" {age_s(r.time, now):>7.1f}s ago  {fields}")
    print("last events:")
    for e in events:
        print("  " + format_event(e))
    return 0


def _print_rich(args: argparse.Namespace, state: dict[tuple[str, str], Record], events: list[Record], *,
                now: dt.datetime, stale: bool, reason: str | None, age: str) -> None:
    """The same facts as the plain text, as two tables (only on a terminal)."""
    out = console()
    status = f"[bold red]STALE[/]: {reason} ({age})" if stale else f"[bold green]live[/] ({age})"
    out.print(f"[bold]{args.vid}[/] ({args.env})  {status}")
    rows = [[ch, f"{r.time:%H:%M:%S.%f}"[:-3], f"{age_s(r.time, now):.1f}s", format_fields(r.data)]
            for ch in STATE_CHANNELS if (r := state.get((args.vid, ch))) is not None]
    out.print(rich_table(["CHANNEL", "TIME", "AGE", "FIELDS"], rows, right=["AGE"]))
    out.print(rich_table(["LAST EVENTS"], [[format_event(e)] for e in events]))


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def main(argv: list[str]) -> int:
    return run_cli(build_parser(), run, argv)
