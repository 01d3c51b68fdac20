"""`mavjet events`: tail the audit trail (TWIN_EVENTS) in readable form.

Piped, one plain line an event (`mavjet.ops.read.format_event`), the stable
form scripts read; `--json` one object a line. On a terminal the same events
in aligned columns (time, vehicle, type, summary), coloured by how much they
matter: failsafes, breaches and critical/error status text red; warnings,
link losses and commands that did not go through yellow
(ops/console.py decides terminal or not, `MAVJET_PLAIN=1` forces plain).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import math
from collections.abc import Callable
from enum import StrEnum
from typing import IO, Any

import anyio
from nats.aio.msg import Msg
from nats.js import api as jsapi
from rich.console import Console
from rich.table import Table
from rich.text import Text

from mavjet.contract import natsconn
from mavjet.contract.errors import ConfigError
from mavjet.contract.events import EventType
from mavjet.contract.subjects import EVENT_TYPES, EVENTS_STREAM, check_token, event_filter
from mavjet.contract.units import parse_duration_s, parse_instant
from mavjet.ops import resolve
from mavjet.ops.console import console, is_tty
from mavjet.ops.read import Record, caught_up, event_summary, event_time, format_event, to_record
from mavjet.ops.resolve import connect
from mavjet.ops.runner import StdoutClosed, run_cli

READ_TIMEOUT_S = 30.0  # a bound only: a read ends when the stream has nothing more to deliver


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


class Severity(StrEnum):
    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"


STYLES = {Severity.CRITICAL: "bold red", Severity.WARNING: "yellow", Severity.INFO: ""}
_CRITICAL_TYPES = frozenset({EventType.FAILSAFE, EventType.GEOFENCE_BREACH})
_WARNING_TYPES = frozenset({
    EventType.LINK_LOST, EventType.SHADOW_FAILED, EventType.LOG_DOWNLOAD_FAILED, EventType.EVENTS_SUPPRESSED,
})
STATUSTEXT_ERROR = 3  # MAV_SEVERITY: 0 EMERGENCY .. 3 ERROR are critical, 4 WARNING a warning
STATUSTEXT_WARNING = 4


def severity(rec: Record) -> Severity:
    """How much an event matters to whoever watches the feed (its colour on a terminal)."""
    if rec.kind in _CRITICAL_TYPES:
        return Severity.CRITICAL
    if rec.kind == EventType.STATUSTEXT:
        level = rec.data.get("severity")
        if isinstance(level, int) and not isinstance(level, bool):
            if level <= STATUSTEXT_ERROR:
                return Severity.CRITICAL
            if level == STATUSTEXT_WARNING:
                return Severity.WARNING
        return Severity.INFO
    if rec.kind == EventType.CMD_RESULT and rec.data.get("result", "accepted") != "accepted":
        return Severity.WARNING  # refused, failed, timed out: the operator's command did not happen
    return Severity.WARNING if rec.kind in _WARNING_TYPES else Severity.INFO


class RichEvents:
    """Events as aligned, coloured rows on a terminal; one row printed (and flushed) per event as it arrives."""

    TIME_W = 24  # 2026-11-23T12:30:00.000Z
    TYPE_W = max(len(t) for t in EVENT_TYPES)  # log_download_progress: no known type is cut

    def __init__(self, out: Console) -> None:
        self.out = out
        self.vid_w = 10  # as the plain form; grows at a longer id (whole ids beat alignment with rows printed before)
        self.header = False

    def _grid(self) -> Table:
        t = Table.grid(padding=(0, 1))
        t.add_column(width=self.TIME_W, no_wrap=True)
        t.add_column(width=self.vid_w, no_wrap=True)
        t.add_column(width=self.TYPE_W, no_wrap=True, overflow="ellipsis")
        t.add_column(overflow="fold")
        return t

    def __call__(self, rec: Record) -> None:
        self.vid_w = max(self.vid_w, len(rec.vid))
        grid = self._grid()
        if not self.header:
            self.header = True
            grid.add_row(*(Text(h, style="bold") for h in ("TIME", "VID", "TYPE", "SUMMARY")))
        style = STYLES[severity(rec)]
        grid.add_row(Text(event_time(rec), style="dim"), Text(rec.vid), Text(rec.kind, style=style or "bold"),
                     Text(event_summary(rec), style=style))
        self.out.print(grid)
        self.out.file.flush()


def event_printer(*, as_json: bool, stream: IO[str] | None = None) -> Callable[[Record], None]:
    """What prints one event: a JSON line, rich rows on a terminal, else the plain line."""
    if as_json:
        return lambda rec: print(json.dumps(record_json(rec), default=str), file=stream, flush=True)
    if is_tty(stream):
        return RichEvents(console(stream))
    return lambda rec: print(format_event(rec), file=stream, flush=True)


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
    nc = await connect(args, name="mavjet-events")
    try:
        if args.vid != "*":
            await resolve.vehicle(nc, args.env, args.vid, needs=(EVENTS_STREAM,))
        else:
            await resolve.require_env(nc.jetstream(), args.env, (EVENTS_STREAM,))
    except BaseException:
        await nc.close()
        raise
    done = asyncio.Event()
    stop = asyncio.Event()  # stdout's reader went away: the command ends (exit 0, a closed pipe)
    printed = 0
    show = event_printer(as_json=args.json)

    async def cb(msg: Msg) -> None:
        nonlocal printed
        if stop.is_set():
            return
        rec = to_record(msg)
        if rec is not None and (until is None or rec.time < until):
            try:
                show(rec)
            except (BrokenPipeError, ValueError):  # a write to a pipe nobody reads (or a closed stdout)
                stop.set()
                done.set()
                return
            printed += 1
        if msg.metadata.num_pending == 0:
            done.set()

    try:
        js = nc.jetstream()
        subject = event_filter(args.env, args.vid, args.type)
        cfg = jsapi.ConsumerConfig(deliver_policy=jsapi.DeliverPolicy.BY_START_TIME, opt_start_time=since)
        sub = await js.subscribe(subject, cb=cb, ordered_consumer=True, config=cfg, idle_heartbeat=2.0)
        if args.follow:
            limit = parse_duration_s(args.duration) if args.duration else None
            try:
                with anyio.move_on_after(limit if limit is not None else math.inf):
                    await stop.wait()
            finally:
                await sub.unsubscribe()
        else:
            # Ends when the stream says there is no more (or at once when nothing is in range).
            await caught_up(sub, done, timeout_s=READ_TIMEOUT_S)
            await sub.unsubscribe()
    finally:
        await nc.close()
    if stop.is_set():
        raise StdoutClosed
    return 0


def main(argv: list[str]) -> int:
    return run_cli(build_parser(), run, argv)
