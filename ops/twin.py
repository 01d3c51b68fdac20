"""`mavjet twin VID`: a vehicle's current state and its last events.

Every channel shows its age (the reader's clock minus the gateway's receive
time) and the twin is marked stale by the one rule in
`mavjet.ops.read.staleness`; `--json` has top-level `stale`, `age_s` (of the
newest vehicle sample), `stale_reason` and `gateway_age_s`.

With ownership it also shows who serves the vehicle (docs/ownership.md,
"Presence"): the owner from its lease and every standby from its presence
record, each with its age, a record past its staleness rule marked gone;
`--json` has them under `ownership` (`owner`, `standbys`, `readable`).
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
    GatewaySeen,
    Record,
    age_s,
    events_since,
    format_event,
    read_lease,
    read_presence,
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
        owner = await read_lease(js, args.env, args.vid)
        standbys = await read_presence(nc, args.env, args.vid)
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
            "ownership": {"owner": None if owner is None else owner.to_json(now),
                          "standbys": [s.to_json(now) for s in standbys or []], "readable": standbys is not None},
        }
        print(json.dumps(doc, indent=2, default=str))
        return 0
    age = "no samples" if fresh.age_s is None else f"newest sample {fresh.age_s:.1f} s old"
    gateways = gateway_lines(owner, standbys, now)
    if is_tty():
        _print_rich(args, state, events, now=now, stale=fresh.stale, reason=fresh.reason, age=age, gateways=gateways)
        return 0
    print(f"{args.vid} ({args.env})  " + (f"STALE: {fresh.reason} ({age})" if fresh.stale else f"live ({age})"))
    for role, text in gateways:
        print(f"  {role:<9} {text}")
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


def gateway_lines(owner: GatewaySeen | None, standbys: list[GatewaySeen] | None,
                  now: dt.datetime) -> list[tuple[str, str]]:
    """(role, text) per gateway of the vehicle: the owner, then each standby, a stale one marked GONE."""
    def age(g: GatewaySeen) -> str:
        a = g.age_s(now)
        return "?" if a is None else f"{a:.1f}s ago"

    lines: list[tuple[str, str]] = []
    if owner is not None:
        head = f"GONE (renewed {age(owner)})" if owner.gone(now) else f"renewed {age(owner)}"
        lines.append(("owner", f"{owner.holder}  since {owner.since}  {head}"))
    for s in standbys or []:
        link = s.link + (f" ({s.active_link})" if s.active_link else "") if s.link else "?"
        head = f"GONE (seen {age(s)})" if s.gone(now) else f"seen {age(s)}"
        lines.append(("standby", f"{s.holder}  link {link}  since {s.since}  {head}"))
    if standbys is None:
        lines.append(("standbys", "unknown (TWIN_LEASES not readable: provision it, or a credential without it)"))
    return lines


def _print_rich(args: argparse.Namespace, state: dict[tuple[str, str], Record], events: list[Record], *,
                now: dt.datetime, stale: bool, reason: str | None, age: str,
                gateways: list[tuple[str, str]]) -> None:
    """The same facts as the plain text, as tables (only on a terminal)."""
    out = console()
    status = f"[bold red]STALE[/]: {reason} ({age})" if stale else f"[bold green]live[/] ({age})"
    out.print(f"[bold]{args.vid}[/] ({args.env})  {status}")
    if gateways:
        out.print(rich_table(["GATEWAY", "WHO"], [[role, text] for role, text in gateways]))
    rows = [[ch, f"{r.time:%H:%M:%S.%f}"[:-3], f"{age_s(r.time, now):.1f}s", format_fields(r.data)]
            for ch in STATE_CHANNELS if (r := state.get((args.vid, ch))) is not None]
    out.print(rich_table(["CHANNEL", "TIME", "AGE", "FIELDS"], rows, right=["AGE"]))
    out.print(rich_table(["LAST EVENTS"], [[format_event(e)] for e in events]))


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def main(argv: list[str]) -> int:
    return run_cli(build_parser(), run, argv)
