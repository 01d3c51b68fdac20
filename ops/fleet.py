"""`mavjet fleet`: a live table of every vehicle's twin, plus the event feed.

It is a pure JetStream client: state through an ordered consumer that starts
with DeliverLastPerSubject (the fleet's current state) and then follows new
samples, events through a second one. Rendering is a pure function of the
collected records so it is tested without a terminal.

A row is `stale` (never `up` or `ARMED`) when its newest vehicle sample is
older than `--stale-after` or its gateway stopped publishing its liveness
record (`mavjet.ops.read.staleness`). `--once` prints the current table and
exits.

The live view fits its terminal (80x24 is the smallest it plans for): the
position column goes first when the width is short, long cells and event
lines are cut to the width, and when the rows do not fit the height the table
keeps as many as fit and says how many more there are. `--vid` filters by glob.
OWNER is the gateway that published the link record (with ownership, the
vehicle's owner); STBY the standbys whose presence records are live
(docs/ownership.md, "Presence"), `-` when TWIN_LEASES cannot be read.
HUB, shown only at a central cluster over leaf hubs, is the edge hub serving
the vehicle: the `hub` its gateway's state digest names in the link record
(gateway/publish/digest.py, docs/deploy.md "Central cluster over leaf hubs").
The event feed shows what an operator acts on: every event but successful
command results (the `cmd_result` of a failed, rejected or expired command
stays); `--all-events` shows everything.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import fnmatch
import json
import shutil
import sys
from collections import deque
from dataclasses import dataclass, field

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import api as jsapi

from mavjet.contract import natsconn
from mavjet.contract.errors import ConfigError
from mavjet.contract.events import EventType
from mavjet.contract.redact import redact
from mavjet.contract.subjects import EVENTS_STREAM, STATE_STREAM, event_filter, state_filter
from mavjet.contract.units import parse_duration_s
from mavjet.ops.console import live_screen, live_text
from mavjet.ops.read import (
    STALE_AFTER_S,
    GatewaySeen,
    PresenceFeed,
    Record,
    caught_up,
    current_state,
    events_since,
    format_event,
    read_presence,
    staleness,
    to_record,
)
from mavjet.ops.resolve import connect, require_env
from mavjet.ops.runner import run_cli

FIRST_FRAME_WAIT_S = 5.0  # a bound only: the first frame comes once what is stored has been read

# A command that ended well is the operator's own doing, not news; anything else is.
QUIET_RESULTS = frozenset({"accepted"})


def operator_cares(r: Record) -> bool:
    return not (r.kind == EventType.CMD_RESULT and r.data.get("result") in QUIET_RESULTS)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def _table_width(head: list[str], rows: list[list[str]]) -> int:
    """The width of the table's widest line: every column at its widest cell, two spaces between."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    return sum(widths) + 2 * (len(widths) - 1)


def title_lines(env: str, url: str, now: dt.datetime, *, live: bool) -> str:
    """The view's header: which server and env, and the line that points another shell at them."""
    stop = "   (Ctrl-C to stop)" if live else ""
    return (f"mavjet fleet — env {env} — {redact(url)} — {now:%H:%M:%S}Z{stop}\n"
            f"in another shell: export MAVJET_NATS={redact(url)} MAVJET_ENV={env}")


@dataclass(slots=True)
class FleetView:
    state: dict[tuple[str, str], Record] = field(default_factory=dict)
    events: deque[Record] = field(default_factory=lambda: deque(maxlen=12))
    stale_after_s: float = STALE_AFTER_S
    vid_glob: str = "*"
    all_events: bool = False
    # (vid, gateway id) -> a standby's presence record; None: TWIN_LEASES not readable (STBY shows "-")
    presence: dict[tuple[str, str], GatewaySeen] | None = field(default_factory=dict)

    def on_presence(self, vid: str, gateway_id: str, seen: GatewaySeen | None) -> None:
        if self.presence is None or not fnmatch.fnmatchcase(vid, self.vid_glob):
            return
        if seen is None:
            self.presence.pop((vid, gateway_id), None)
        else:
            self.presence[(vid, gateway_id)] = seen

    def standbys(self, vid: str, now: dt.datetime) -> int | None:
        """How many standbys of `vid` are live (a record past its staleness rule counts as gone)."""
        if self.presence is None:
            return None
        return sum(1 for (v, _), s in self.presence.items() if v == vid and not s.gone(now))

    def on_state(self, r: Record) -> None:
        if fnmatch.fnmatchcase(r.vid, self.vid_glob):
            self.state[(r.vid, r.kind)] = r

    def on_event(self, r: Record) -> None:
        if fnmatch.fnmatchcase(r.vid, self.vid_glob) and (self.all_events or operator_cares(r)):
            self.events.append(r)

    def vehicles(self) -> list[str]:
        return sorted({vid for vid, _ in self.state})

    def rows(self, now: dt.datetime) -> list[list[str]]:
        rows = []
        for vid in self.vehicles():
            st = self.state.get((vid, "status"))
            pos = self.state.get((vid, "position"))
            bat = self.state.get((vid, "battery"))
            link = self.state.get((vid, "link"))
            fresh = staleness({ch: r for (v, ch), r in self.state.items() if v == vid}, now, self.stale_after_s)
            s = st.data if st else {}
            p = pos.data if pos else {}
            flags = " FAILSAFE" if s.get("failsafe") else ""
            if fresh.stale:
                # The last known values are history, not the vehicle's state.
                armed, link_col = "stale", f"stale: {fresh.reason}"
            else:
                armed = "ARMED" if s.get("armed") else "disarmed" if s else "?"
                link_col = str(link.data.get("state", "?")) if link else "?"
            rows.append([
                vid,
                str(s.get("mode") or "?") + flags,
                armed,
                f"{p['lat_deg']:.5f},{p['lon_deg']:.5f}" if p.get("lat_deg") is not None else "-",
                f"{p['alt_m']:.1f}" if p.get("alt_m") is not None else "-",
                f"{p.get('groundspeed_m_s', 0.0):.1f}" if p else "-",
                f"{bat.data['remaining_pct']:.0f}%" if bat and bat.data.get("remaining_pct") is not None else "-",
                link_col,
                # The gateway that published the link record: with ownership, the vehicle's owner.
                str(link.data.get("gateway") or "-") if link else "-",
                "-" if fresh.age_s is None else f"{fresh.age_s:.1f}s",
                "-" if (n := self.standbys(vid, now)) is None else str(n),
                *([str(link.data.get("hub") or "-") if link else "-"] if self.has_hubs() else []),
            ])
        return rows

    def has_hubs(self) -> bool:
        """At a central cluster: some vehicle's link record names its edge hub (the HUB column)."""
        return any(ch == "link" and r.data.get("hub") for (_, ch), r in self.state.items())

    def to_json(self, now: dt.datetime) -> dict[str, object]:
        """What `--once --json` prints: a row per vehicle with its staleness, and the feed."""
        vehicles = []
        for vid in self.vehicles():
            chans = {ch: r for (v, ch), r in self.state.items() if v == vid}
            fresh = staleness(chans, now, self.stale_after_s)
            status = chans["status"].data if "status" in chans else {}
            link = chans["link"].data if "link" in chans else {}
            vehicles.append({
                "vid": vid, "stale": fresh.stale, "stale_reason": fresh.reason,
                "age_s": None if fresh.age_s is None else round(fresh.age_s, 3),
                # Who serves it: the owner's holder (its link record), live standbys (None: not readable).
                "owner": link.get("owner") or link.get("gateway"), "standbys": self.standbys(vid, now),
                # At a central cluster over leaf hubs: the edge hub serving it (None elsewhere).
                "hub": link.get("hub"),
                # A stale row's last values are history: they are given, but under `last`.
                **({"last": {ch: r.data for ch, r in chans.items()}} if fresh.stale else
                   {"mode": status.get("mode"), "armed": status.get("armed"),
                    "state": {ch: r.data for ch, r in chans.items()}}),
            })
        events = [{"time": e.time.isoformat(), "vid": e.vid, "type": e.kind, "data": e.data} for e in self.events]
        return {"time": now.isoformat(), "vehicles": vehicles, "events": events}

    def render(self, now: dt.datetime, title: str = "", *, width: int | None = None, height: int | None = None) -> str:
        """The table and the feed; with `width`/`height` (a terminal's), cut to fit them."""
        head = ["VEHICLE", "MODE", "ARMED", "POSITION", "ALT m", "GS m/s", "BATT", "LINK", "OWNER", "AGE", "STBY"]
        rows = self.rows(now)
        if rows and len(rows[0]) > len(head):
            head.append("HUB")  # a central cluster's rows name their hub (has_hubs)
        if width is not None and _table_width(head, rows) > width:
            # Who serves it (owner, standbys) goes first, then the position: the rest is what a glance needs.
            head = head[:8] + head[9:10]
            rows = [r[:8] + r[9:10] for r in rows]
        if width is not None and _table_width(head, rows) > width:
            head = head[:3] + head[4:]
            rows = [r[:3] + r[4:] for r in rows]
            if _table_width(head, rows) > width:  # then long modes and link reasons are cut
                rows = [[_cut(c, 14) for c in r] for r in rows]
        widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
        lines = title.splitlines() if title else []
        lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip())
        table = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        table = table or ["(no vehicles yet)"]  # a line like any row: the height below counts it
        feed = [format_event(e) for e in self.events] or ["(none yet)"]
        if height is not None:
            # Title, header, blank, EVENTS heading and at least 3 feed lines are kept.
            room = max(1, height - len(lines) - 2 - min(len(feed), 3))
            if len(table) > room:
                hidden = len(table) - (room - 1)
                table = [*table[: room - 1], f"… {hidden} more (--vid GLOB to filter)"]
            feed = feed[-max(1, height - len(lines) - len(table) - 2):]
        lines += table
        lines.append("")
        lines.append("EVENTS")
        lines += feed
        if width is not None:
            lines = [_cut(line, width) for line in lines]
        return "\n".join(lines)


async def follow(nc: Client, env: str, view: FleetView, *, event_history: int = 12,
                 caught_up_s: float = 0.0) -> list[object]:
    """Start the two subscriptions feeding `view`; returns them for unsubscribe.

    With `caught_up_s`, returns once both have delivered what was stored (or
    at once for an empty one), waiting at most that long: the first frame then
    shows the fleet, not an empty table.
    """
    js = nc.jetstream()
    state_done, events_done = asyncio.Event(), asyncio.Event()

    async def on_state(msg: Msg) -> None:
        r = to_record(msg)
        if r is not None:
            view.on_state(r)
        if msg.metadata.num_pending == 0:
            state_done.set()

    async def on_event(msg: Msg) -> None:
        r = to_record(msg)
        if r is not None:
            view.on_event(r)
        if msg.metadata.num_pending == 0:
            events_done.set()

    scfg = jsapi.ConsumerConfig(deliver_policy=jsapi.DeliverPolicy.LAST_PER_SUBJECT)
    ssub = await js.subscribe(state_filter(env), cb=on_state, ordered_consumer=True, config=scfg)
    since = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=10)
    ecfg = jsapi.ConsumerConfig(deliver_policy=jsapi.DeliverPolicy.BY_START_TIME, opt_start_time=since)
    esub = await js.subscribe(event_filter(env), cb=on_event, ordered_consumer=True, config=ecfg)
    presence = PresenceFeed(nc, env)
    feed: PresenceFeed | None = presence
    try:
        await presence.start(view.on_presence)
    except Exception:  # TWIN_LEASES not provisioned, or a credential without it: STBY shows "-"
        view.presence, feed = None, None
    if caught_up_s > 0:
        await caught_up(ssub, state_done, timeout_s=caught_up_s)
        await caught_up(esub, events_done, timeout_s=caught_up_s)
        if feed is not None:
            await feed.caught_up(caught_up_s)
    return [ssub, esub] if feed is None else [ssub, esub, feed]


async def snapshot(nc: Client, env: str, *, stale_after_s: float = STALE_AFTER_S, vid_glob: str = "*",
                   all_events: bool = False) -> FleetView:
    """The fleet's current state and last events, read once (bounded; no subscription left behind)."""
    js = nc.jetstream()
    view = FleetView(stale_after_s=stale_after_s, vid_glob=vid_glob, all_events=all_events)
    for r in (await current_state(js, env)).values():
        view.on_state(r)
    since = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=10)
    for e in await events_since(js, env, since=since, last=view.events.maxlen):
        view.on_event(e)
    standbys = await read_presence(nc, env)
    if standbys is None:
        view.presence = None
    else:
        for s in standbys:
            view.on_presence(s.vid, s.holder, s)
    return view


async def show(nc: Client, env: str, *, refresh_s: float, duration_s: float | None, clear: bool,
               stale_after_s: float = STALE_AFTER_S, vid_glob: str = "*", all_events: bool = False,
               url: str | None = None) -> FleetView:
    view = FleetView(stale_after_s=stale_after_s, vid_glob=vid_glob, all_events=all_events)
    subs = await follow(nc, env, view, caught_up_s=FIRST_FRAME_WAIT_S)
    loop = asyncio.get_running_loop()
    end = None if duration_s is None else loop.time() + duration_s
    shown_url = url or (str(nc.connected_url.geturl()) if nc.connected_url is not None else "?")
    # On a terminal, rich's Live redraws in the alternate screen (restored on exit, no flicker);
    # the frame is still render()'s text, cut to the terminal, so it fits 80x24 as tested.
    screen = live_screen() if clear else contextlib.nullcontext()
    try:
        with screen as live:
            first = True
            while True:
                if not first:  # the first frame as soon as what is stored has been read
                    await asyncio.sleep(refresh_s)
                first = False
                now = dt.datetime.now(dt.UTC)
                size = shutil.get_terminal_size((80, 24))
                fit = {"width": size.columns, "height": size.lines - 1} if clear else {}
                text = view.render(now, title_lines(env, shown_url, now, live=True), **fit)
                if live is not None:
                    live.update(live_text(text), refresh=True)
                else:
                    sys.stdout.write(text + "\n\n")
                    sys.stdout.flush()
                if end is not None and loop.time() >= end:
                    break
        if clear:  # --duration ran out: the last frame stays on the restored screen
            sys.stdout.write(text + "\n")
            sys.stdout.flush()
        return view
    finally:
        for s in subs:
            if isinstance(s, PresenceFeed):
                await s.stop()
            else:
                await s.unsubscribe()  # type: ignore[attr-defined]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mavjet fleet", description="Live table of every vehicle's twin and the event feed.")
    p.add_argument("--refresh", default="1s", help="redraw interval (default: %(default)s)")
    p.add_argument("--duration", help="stop after this long (default: until Ctrl-C)")
    p.add_argument("--no-clear", action="store_true", help="append frames instead of redrawing the screen")
    p.add_argument("--once", action="store_true", help="print the current table once and exit (scripts, tests)")
    p.add_argument("--json", action="store_true", help="with --once: the table and feed as JSON (for scripts)")
    p.add_argument("--vid", default="*", metavar="GLOB", help="only vehicles whose id matches, e.g. 'VID-01*'")
    p.add_argument("--all-events", action="store_true",
                   help="show every event (default: all but successful command results)")
    p.add_argument("--stale-after", default=f"{STALE_AFTER_S:g}s", type=parse_duration_s, metavar="DURATION",
                   help="mark a vehicle stale when its newest sample is older than this (default: %(default)s)")
    natsconn.add_nats_arguments(p)
    return p


async def run(args: argparse.Namespace) -> int:
    stale_after_s: float = args.stale_after
    nc = await connect(args, name="mavjet-fleet")
    try:
        await require_env(nc.jetstream(), args.env, (STATE_STREAM, EVENTS_STREAM))
        if args.once:
            view = await snapshot(nc, args.env, stale_after_s=stale_after_s, vid_glob=args.vid,
                                  all_events=args.all_events)
            now = dt.datetime.now(dt.UTC)
            if args.json:
                print(json.dumps(view.to_json(now), indent=2, default=str))
            else:
                print(view.render(now, title_lines(args.env, args.nats, now, live=False)))
            return 0
        if args.json:
            raise ConfigError("json", "--json goes with --once (the live view is for people)")
        await show(nc, args.env, refresh_s=parse_duration_s(args.refresh),
                   duration_s=parse_duration_s(args.duration) if args.duration else None,
                   clear=not args.no_clear and sys.stdout.isatty(), stale_after_s=stale_after_s,
                   vid_glob=args.vid, all_events=args.all_events, url=args.nats)
    finally:
        await nc.close()
    return 0


def main(argv: list[str]) -> int:
    return run_cli(build_parser(), run, argv)
