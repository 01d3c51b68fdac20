"""`mavjet events`: tail the audit trail (TWIN_EVENTS) in readable form."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
from typing import Any

import anyio
from nats.aio.msg import Msg
from nats.js import api as jsapi

from gateway.contract import natsconn
from gateway.contract.errors import ConfigError
from gateway.contract.subjects import check_token, event_filter
from gateway.contract.units import parse_duration_s, parse_instant
from gateway.ops.read import Record, format_event, to_record
from gateway.ops.runner import run_cli


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mavjet events", description="Tail the event audit trail.")
    p.add_argument("--vid", default="*", help="one vehicle (default: all)")
    p.add_argument("--type", default=">", help="one event type, e.g. failsafe (default: all)")
    p.add_argument("--since", default="10m",
                   help="where to start: a duration ago (30s, 10m, 24h), today, yesterday, an ISO time "
                        "(2026-11-20T10:00, UTC) or epoch seconds (default: %(default)s)")
    p.add_argument("--until", help="stop at this time (same forms as --since); not with --follow")
    p.add_argument("--json", action="store_true", help="one JSON object per event (for scripts)")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new events")
    p.add_argument("--duration", help="with --follow: stop after this long (e.g. 60s)")
    natsconn.add_nats_arguments(p)
    return p


def _instant(key: str, value: str) -> dt.datetime:
    try:
        return parse_instant(value)
    except ValueError as exc:
        raise ConfigError(key, str(exc)) from None


def record_json(rec: Record) -> dict[str, Any]:
    """An event as plain JSON: what `--json` prints, one object a line."""
    return {"time": rec.time.isoformat(), "vid": rec.vid, "type": rec.kind, "seq": rec.seq, "data": rec.data}


async def run(args: argparse.Namespace) -> int:
    if args.vid != "*":
        check_token("vid", args.vid)
    since = _instant("since", args.since)
    until = _instant("until", args.until) if args.until else None
    if until is not None and args.follow:
        raise ConfigError("until", "--until and --follow exclude each other")
    if until is not None and until <= since:
        raise ConfigError("until", f"{args.until!r} is not after --since {args.since!r}")
    nc = await natsconn.connect_once(natsconn.options_from_args(args, name="mavjet-events"))
    caught_up = asyncio.Event()
    printed = 0

    async def cb(msg: Msg) -> None:
        nonlocal printed
        rec = to_record(msg)
        if rec is not None and (until is None or rec.time < until):
            print(json.dumps(record_json(rec), default=str) if args.json else format_event(rec), flush=True)
            printed += 1
        if msg.metadata.num_pending == 0:
            caught_up.set()

    try:
        js = nc.jetstream()
        subject = event_filter(args.env, args.vid, args.type)
        cfg = jsapi.ConsumerConfig(deliver_policy=jsapi.DeliverPolicy.BY_START_TIME, opt_start_time=since)
        sub = await js.subscribe(subject, cb=cb, ordered_consumer=True, config=cfg, idle_heartbeat=2.0)
        if args.follow:
            limit = parse_duration_s(args.duration) if args.duration else None
            try:
                if limit is None:
                    await asyncio.Event().wait()
                else:
                    await asyncio.sleep(limit)
            finally:
                await sub.unsubscribe()
        else:
            with anyio.move_on_after(3.0):  # nothing in range: the callback never runs
                await caught_up.wait()
            await sub.unsubscribe()
    finally:
        await nc.close()
    return 0


def main(argv: list[str]) -> int:
    return run_cli(build_parser(), run, argv)
