"""The flight recorder: while a vehicle is armed, its position goes to TWIN_TRACKS at `track_hz`.

TWIN_STATE is latest-wins and keeps an hour; a flight reconstructed weeks
later needs the positions themselves. Each armed vehicle gets one sample per
`1 / track_hz` seconds on `fleet.<env>.veh.<vid>.track` (one subject per
vehicle), plus one sample when `armed` flips either way, timed at the
armed/disarmed event, so every flight's track starts and ends with its
flight (`analytics.fleet.flight_samples` joins samples to flights by that
span).

A sample is the newest position the twin holds, timed by when the gateway
received it (the gateway clock, gateway/clock.py); a position older than the
last sample is not sampled again, so a vehicle whose link is down records
nothing rather than repeating itself. The payload is the usual envelope
(`gateway.contract.envelope`) with a small `data` map (`track_sample`): about
180 bytes, 340 stored (docs/analytics.md, Flight recorder).

Never blocking telemetry: sampling reads the twin's fields (no I/O) on this
service's own task; samples go to a spool of their own
(`state_dir/tracks.sqlite`, the event spool's class `gateway.spool.Spool`,
bounded by `spool_max_events`, the oldest sample dropped first), and a drainer
publishes them oldest first with a `Nats-Msg-Id`, so a NATS outage or a
restart loses nothing and a republish is de-duplicated. Tracks never share the
event spool: a missing TWIN_TRACKS stream (a server provisioned before the
recorder existed) must not hold back a single event, and a long flight must
not push events out of the event spool.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import structlog
from anyio.abc import TaskStatus

from drivers.mavlink.backoff import Backoff
from gateway.config import GatewayConfig
from gateway.contract import envelope
from gateway.contract.envelope import CONTENT_TYPE
from gateway.contract.subjects import TRACKS_STREAM, track_subject
from gateway.services import ServiceContext, TelemetryView
from gateway.spool import Spool
from gateway.telemetry import Event

log = structlog.get_logger("mavjet.recorder")

DRAIN_BATCH = 256
TRACKS_SPOOL = "tracks.sqlite"


def _num(v: Any, ndigits: int) -> int | float | None:
    """A number as small as msgpack can pack it: an int when whole (1 byte for 0..127), else rounded."""
    if v is None or isinstance(v, bool) or not isinstance(v, int | float):
        return None
    r = round(float(v), ndigits)
    return int(r) if r.is_integer() and abs(r) < 2**31 else r


def track_sample(position: Mapping[str, Any], battery: Mapping[str, Any] | None, *, armed: bool) -> dict[str, Any]:
    """The `data` of one track sample, from the twin's position and battery channels.

    Keys follow the contract's names and units (docs/design.md, Tracks), so a
    reader decodes them like any event's snapshot: lat_deg, lon_deg (full
    precision), alt_m (above home), alt_msl_m, groundspeed_m_s, heading_deg,
    battery_pct, voltage_v, armed. Unknown values are left out, and whole
    numbers travel as ints, which keeps a sample compact.
    """
    data: dict[str, Any] = {"lat_deg": position.get("lat_deg"), "lon_deg": position.get("lon_deg")}
    for key, src, nd in (("alt_m", "alt_m", 2), ("alt_msl_m", "alt_msl_m", 2),
                         ("groundspeed_m_s", "groundspeed_m_s", 2), ("heading_deg", "heading_deg", 0)):
        v = _num(position.get(src), nd)
        if v is not None:
            data[key] = v
    if battery:
        for key, src, nd in (("battery_pct", "remaining_pct", 0), ("voltage_v", "voltage_v", 2)):
            v = _num(battery.get(src), nd)
            if v is not None:
                data[key] = v
    data["armed"] = armed
    return data


def encode_sample(vid: str, time_ns: int, data: dict[str, Any]) -> bytes:
    return envelope.pack(vid, time_ns, data)


def track_msg_id(vid: str, time_ns: int) -> str:
    """Deterministic: a sample republished after an outage is dropped by the stream's duplicate window."""
    return f"{vid}:track:{time_ns}"


class TrackRecorder:
    """The flight recorder as a `GatewayService` (the daemon adds it when `track_hz` > 0)."""

    def __init__(self, cfg: GatewayConfig, *, spool_path: Path | None = None) -> None:
        if cfg.track_hz <= 0:
            raise ValueError("the recorder needs track_hz > 0")
        self.cfg = cfg
        self.period_s = 1.0 / cfg.track_hz
        self.spool = Spool(spool_path or cfg.state_dir / TRACKS_SPOOL, max_entries=cfg.spool_max_events)
        self._pending: list[tuple[str, str, bytes]] = []
        self._last_ns: dict[str, int] = {}  # per vehicle: the time of its newest sample
        self._wrote = anyio.Event()
        self.samples = 0  # taken (spooled)
        self.published = 0  # acked by TWIN_TRACKS
        self.dropped = 0  # dropped at the spool's bound
        self._error_logged = -1e9

    # -- sampling (on the loop, no I/O) -------------------------------------
    def _sample(self, vid: str, tv: TelemetryView, time_ns: int, *, armed: bool) -> None:
        pos = tv.channels.get("position")
        if pos is None or pos.get("lat_deg") is None:
            return  # no position yet: nothing to record (the armed events still carry the snapshot)
        data = track_sample(pos, tv.channels.get("battery"), armed=armed)
        self._pending.append((track_subject(self.cfg.env, vid), track_msg_id(vid, time_ns),
                              encode_sample(vid, time_ns, data)))
        self._last_ns[vid] = time_ns
        self.samples += 1

    def _on_event(self, vid: str, tv: TelemetryView, ev: Event) -> None:
        """`armed` flipped: a sample now, at the event's time, so the track spans the flight exactly."""
        if ev.type in ("armed", "disarmed") and ev.time_ns > self._last_ns.get(vid, 0):
            self._sample(vid, tv, ev.time_ns, armed=ev.type == "armed")

    def tick(self, ctx: ServiceContext) -> None:
        """One sample per armed vehicle with a position newer than its last sample."""
        for vid, handle in ctx.vehicles.items():
            try:
                tv = handle.telemetry
                if not tv.armed:
                    continue
                t = tv.sample_ns.get("position")
                if t is not None and t > self._last_ns.get(vid, 0):
                    self._sample(vid, tv, t, armed=True)
            except Exception:  # one vehicle's odd telemetry must not stop the others' tracks
                handle.report_error("track")

    # -- spool and NATS --------------------------------------------------------
    async def _flush(self, ctx: ServiceContext) -> None:
        if not self._pending:
            return
        batch, self._pending = self._pending, []
        drops = await self.spool.append(batch)
        if drops:
            self.dropped += drops.total
            ctx.metrics.publishes.labels(kind="track", result="dropped").inc(drops.total)
        self._wrote.set()

    async def drain_once(self, ctx: ServiceContext) -> int:
        """Publish spooled samples oldest first until the spool is empty; returns how many."""
        js = ctx.nats.js
        if js is None or not ctx.nats.is_connected:
            return 0
        total = 0
        while True:
            batch = await self.spool.peek(DRAIN_BATCH)
            if not batch:
                return total
            futs = [await js.publish_async(e.subject, e.payload, headers={"Content-Type": CONTENT_TYPE,
                                                                           "Nats-Msg-Id": e.msg_id})
                    for e in batch]
            last_ok = None
            try:
                with anyio.fail_after(self.cfg.publish_timeout_s):
                    for e, fut in zip(batch, futs, strict=True):
                        await fut
                        last_ok = e.rowid
            finally:
                if last_ok is None:
                    for f in futs:
                        f.cancel()
                else:
                    n = sum(1 for e in batch if e.rowid <= last_ok)
                    await self.spool.remove_upto(last_ok)
                    self.published += n
                    total += n
                    ctx.metrics.publishes.labels(kind="track", result="acked").inc(n)

    async def _drainer(self, ctx: ServiceContext) -> None:
        backoff = Backoff(initial_s=self.cfg.nats_backoff_initial_s, max_s=self.cfg.nats_backoff_max_s)
        while True:
            await self._wrote.wait()
            self._wrote = anyio.Event()
            await ctx.jetstream()  # waits while NATS is away; the samples wait in the spool
            try:
                await self.drain_once(ctx)
                backoff.reset()
            except Exception as exc:
                ctx.metrics.publishes.labels(kind="track", result="error").inc()
                now = time.monotonic()
                if now - self._error_logged >= 60.0:
                    self._error_logged = now
                    log.warning("track_publish_failed", error=f"{type(exc).__name__}: {exc}", spooled=self.spool.depth,
                                hint=f"is {TRACKS_STREAM} provisioned for this env? (mavjet provision)")
                self._wrote.set()
                await anyio.sleep(backoff.next_delay_s())

    async def run(self, ctx: ServiceContext, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        await self.spool.open()
        if self.spool.depth:
            self._wrote.set()  # what an earlier run left goes out first
        unsubscribe = [h.subscribe(partial(self._on_event, vid, h.telemetry)) for vid, h in ctx.vehicles.items()]
        log.info("track_recorder_started", track_hz=self.cfg.track_hz, vehicles=len(ctx.vehicles),
                 spooled=self.spool.depth)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._drainer, ctx, name="gateway.track_drainer")
                task_status.started()
                next_t = time.monotonic()
                while True:
                    self.tick(ctx)
                    await self._flush(ctx)
                    # A fixed schedule: tick jitter does not lower the rate.
                    next_t = max(next_t + self.period_s, time.monotonic())
                    await anyio.sleep(max(0.0, next_t - time.monotonic()))
        finally:
            for unsub in unsubscribe:
                unsub()
            with anyio.CancelScope(shield=True):
                # The last samples (a disarm at shutdown) are kept for the next run; then a short,
                # bounded try at publishing them now.
                await self._flush(ctx)
                with anyio.move_on_after(min(2.0, self.cfg.shutdown_timeout_s)):
                    try:
                        await self.drain_once(ctx)
                    except Exception as exc:
                        log.warning("track_drain_incomplete", error=f"{type(exc).__name__}: {exc}",
                                    spooled=self.spool.depth)
                self.spool.close()
