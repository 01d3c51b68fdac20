"""`mavjet twin VID`: a vehicle's current state and its last events."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gateway.contract import natsconn
from gateway.contract.subjects import STATE_CHANNELS, check_token
from gateway.ops.read import current_state, events_since, format_event
from gateway.ops.runner import run_cli


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mavjet twin", description="Print a vehicle's current state and last events.")
    p.add_argument("vid", help="vehicle id, e.g. VID-001")
    p.add_argument("--events", type=int, default=10, help="how many recent events to show (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    natsconn.add_nats_arguments(p)
    return p


async def run(args: argparse.Namespace) -> int:
    check_token("vid", args.vid)
    nc = await natsconn.connect_once(natsconn.options_from_args(args, name="mavjet-twin"))
    try:
        js = nc.jetstream()
        state = await current_state(js, args.env, args.vid)
        events = await events_since(js, args.env, vid=args.vid, last=args.events)
    finally:
        await nc.close()
    if not state and not events:
        print(f"mavjet twin: no twin data for {args.vid} in env {args.env!r}", file=sys.stderr)
        return 1
    if args.json:
        doc: dict[str, Any] = {
            "vid": args.vid,
            "state": {ch: {"time": r.time.isoformat(), **r.data} for (_, ch), r in sorted(state.items())},
            "events": [{"type": e.kind, "time": e.time.isoformat(), **e.data} for e in events],
        }
        print(json.dumps(doc, indent=2, default=str))
        return 0
    print(f"{args.vid} ({args.env})")
    for ch in STATE_CHANNELS:
        r = state.get((args.vid, ch))
        if r is None:
            continue
        fields = ", ".join(f"{k}={_fmt(v)}" for k, v in r.data.items() if v is not None)
        print(f"  {ch:<9} {r.time:%H:%M:%S.%f}"[:-3] + f"  {fields}")
    print("last events:")
    for e in events:
        print("  " + format_event(e))
    return 0


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def main(argv: list[str]) -> int:
    return run_cli(build_parser(), run, argv)
