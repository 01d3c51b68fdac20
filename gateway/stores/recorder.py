"""The flight recorder: while a vehicle is armed, its position goes to TWIN_TRACKS at `track_hz`.

TWIN_STATE is latest-wins and keeps an hour; a flight reconstructed weeks
later needs the positions themselves. Each armed vehicle gets one sample per
`1 / track_hz` seconds on `fleet.<env>.veh.<vid>.track` (one subject per
vehicle), plus one sample when `armed` flips either way, timed at the
armed/disarmed event, so every flight's track starts and ends with its
flight (`mavjet.analytics.fleet.flight_samples` joins samples to flights by that
span).

A sample is the newest position the twin holds, timed by when the gateway
received it (the gateway clock, gateway/twin/clock.py); a position older than the
last sample is not sampled again, so a vehicle whose link is down records
nothing rather than repeating itself. The payload is the usual envelope
(`mavjet.contract.envelope`) with a small `data` map (`mavjet.contract.tracks`): about
180 bytes, 340 stored (docs/analytics.md, Flight recorder).

Never blocking telemetry: sampling reads the twin's fields (no I/O) on this
service's own task; samples go to a spool of their own
(`state_dir/tracks.sqlite`, the event spool's class `mavjet.gateway.publish.spool.Spool`,
bounded by `spool_max_events`, the oldest sample dropped first), and a drainer
publishes them oldest first with a `Nats-Msg-Id`, so a NATS outage or a
restart loses nothing and a republish is de-duplicated. Tracks never share the
event spool: a missing TWIN_TRACKS stream (a server provisioned before the
recorder existed) must not hold back a single event, and a long flight must
not push events out of the event spool.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import anyio
import structlog
from anyio.abc import TaskStatus

from mavjet.contract.events import EventType
from mavjet.contract.subjects import TRACKS_STREAM, track_subject
from mavjet.contract.tracks import encode_sample, track_msg_id, track_sample
from mavjet.drivers.mavlink.backoff import Backoff
from mavjet.gateway.config import GatewayConfig
from mavjet.gateway.publish.spool import Spool
from mavjet.gateway.publish.spooldrain import drain_spool
from mavjet.gateway.services import ServiceContext, TelemetryView, VehicleHandle
from mavjet.gateway.twin.telemetry import Event

log = structlog.get_logger("mavjet.recorder")

TRACKS_SPOOL = "tracks.sqlite"


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

    def _on_event(self, vid: str, handle: VehicleHandle, ev: Event) -> None:
        """`armed` flipped: a sample now, at the event's time, so the track spans the flight exactly."""
        if ev.type in (EventType.ARMED, EventType.DISARMED) and ev.time_ns > self._last_ns.get(vid, 0) \
                and handle.may_record():
            self._sample(vid, handle.telemetry, ev.time_ns, armed=ev.type == EventType.ARMED)

    def tick(self, ctx: ServiceContext) -> None:
        """One sample per armed vehicle with a position newer than its last sample."""
        for vid, handle in ctx.vehicles.items():
            try:
                tv = handle.telemetry
                if not tv.armed or not handle.may_record():  # a standby records nothing: the owner does
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
        return await drain_spool(self.spool, js, timeout_s=self.cfg.publish_timeout_s,
                                 on_acked=partial(self._acked, ctx))

    def _acked(self, ctx: ServiceContext, n: int, _elapsed_s: float) -> None:
        self.published += n
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
        unsubscribe = [h.subscribe(partial(self._on_event, vid, h)) for vid, h in ctx.vehicles.items()]
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
