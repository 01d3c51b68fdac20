"""One vehicle's shadow controller: desired → vehicle, vehicle → reported.

A pass runs the steps (mavjet.gateway.shadow.steps: params, mission, geofence,
rates, mode, armed) in that order; each compares the desired document with
what was last read back and acts on what differs through the vehicle's
MAVLink session. Passes run when the desired document changes, when the
vehicle does something relevant (link restored, mode change, failsafe), when
a retry is due, when a shadowed parameter changes on the vehicle (an
unsolicited PARAM_VALUE, forwarded by the twin as an internal `param_value`
event: `reported` is written with the drift, then a pass restores it), and
on an idle tick. A pass on a converged vehicle does no
MAVLink I/O: everything it would read is cached in `LiveConfig` until a
reboot, a reconnect or `verify_interval_s` clears it, and then it is read
back again (level-triggered: re-applied if it drifted).

Safety: flight state is acted on at most once per desired revision, never
during a failsafe or while the autopilot holds the vehicle in a recovery
mode it chose, never disarms in flight, and never forces arming; failed
attempts are retried only after a capped backoff and a bounded number of
times. What was done is recorded in `reported.applied`, so a restarted
gateway does not repeat it.

The reconciler never raises into the gateway: every error becomes a reason
in `reported.delta`, a log line and a later retry.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import structlog

from mavjet.contract.errors import LinkError
from mavjet.contract.events import EventType
from mavjet.contract.subjects import shadow_key
from mavjet.drivers.mavlink.autopilot import is_airborne
from mavjet.drivers.mavlink.modes import RECOVERY_MODES
from mavjet.drivers.mavlink.plan import Plan
from mavjet.gateway.config import GatewayConfig
from mavjet.gateway.runtime.metrics import GatewayMetrics
from mavjet.gateway.services import NatsAccess, VehicleHandle
from mavjet.gateway.shadow.book import RetryBook
from mavjet.gateway.shadow.config import ShadowConfig
from mavjet.gateway.shadow.diff import FlightRecord, LiveConfig, VehicleView, iso, retry_delay_s
from mavjet.gateway.shadow.document import EMPTY, Desired, parse_desired
from mavjet.gateway.shadow.identity import IdentityWriter
from mavjet.gateway.shadow.kvstore import DesiredEntry, ReportedWriter, ShadowStore
from mavjet.gateway.shadow.steps import (
    FlightStep,
    FlightTracker,
    GeofenceStep,
    MissionStep,
    ParamsStep,
    RatesStep,
    Step,
    StepContext,
)
from mavjet.gateway.shadow.steps.base import fmt_number
from mavjet.gateway.shadow.steps.geofence import reported_fence
from mavjet.gateway.shadow.steps.params import on_param_value
from mavjet.gateway.shadow.watch import DesiredSource, KeyDesired
from mavjet.gateway.stores.blobs import fetch_plan
from mavjet.gateway.twin.telemetry import Event

log = structlog.get_logger("mavjet.shadow")

_WAKE_EVENTS = frozenset({
    EventType.LINK_RESTORED, EventType.LINK_LOST, EventType.MODE_CHANGED, EventType.ARMED, EventType.DISARMED,
    EventType.FAILSAFE,
})


class VehicleReconciler:
    def __init__(self, vehicle: VehicleHandle, store: ShadowStore, cfg: ShadowConfig, *, gateway: GatewayConfig,
                 nats: NatsAccess, metrics: GatewayMetrics, source: DesiredSource | None = None) -> None:
        self.vehicle = vehicle
        self.vid = vehicle.vid
        self.store = store
        self.cfg = cfg
        self.gateway_cfg = gateway
        self.nats = nats
        self.metrics = metrics
        self.desired_key = shadow_key(gateway.env, self.vid, "desired")
        # Where `desired` is heard: the gateway's shared watch (ShadowService), or a watch of this key alone.
        self.source: DesiredSource = source or KeyDesired(store, resync_interval_s=cfg.resync_interval_s)
        self.writer = ReportedWriter(store, shadow_key(gateway.env, self.vid, "reported"),
                                     max_conflicts=cfg.max_conflicts)
        self.identity = IdentityWriter(store, self.vid, gateway, request_timeout_s=cfg.request_timeout_s)
        self.desired: Desired = EMPTY
        self.live = LiveConfig()
        self.book = RetryBook(retry_initial_s=cfg.retry_initial_s, retry_max_s=cfg.retry_max_s,
                              fail_after_attempts=cfg.fail_after_attempts)
        self.applied: dict[str, FlightRecord] = {}
        self.flight = FlightTracker()
        self.steps: tuple[Step, ...] = (
            ParamsStep(),
            MissionStep(self._plan),
            GeofenceStep(),
            RatesStep(request_timeout_s=cfg.request_timeout_s),
            *(FlightStep(f, cfg=cfg, tracker=self.flight, applied=self.applied, view=self.view)
              for f in ("mode", "armed")),
        )
        self.converged = False
        self.passes = 0
        self._wake = anyio.Event()
        self._verified_mono = time.monotonic()
        self._last_report: dict[str, Any] | None = None
        self._last_report_mono = 0.0
        self._connects = -1
        self._boot_ms = 0
        self._restored = False
        self._report_due = False  # a drift was heard: write `reported` before the pass that restores it
        vehicle.subscribe(self._on_event)

    # -- inputs -------------------------------------------------------------------------
    def _on_event(self, ev: Event) -> None:
        if ev.type == EventType.PARAM_VALUE:
            self._on_param_value(ev)
            return
        if ev.type not in _WAKE_EVENTS and ev.type != EventType.STATUSTEXT:
            return
        now = time.monotonic()
        if ev.type == EventType.STATUSTEXT:
            self.flight.on_statustext(str(ev.data.get("text", "")), now)
            return
        if ev.type == EventType.MODE_CHANGED:
            self.flight.on_mode(str(ev.data.get("mode")), now)
        if ev.type == EventType.LINK_RESTORED:
            self._invalidate("link restored")
        self.flight.changed()
        self._wake.set()

    def _on_param_value(self, ev: Event) -> None:
        """Any PARAM_VALUE (ours or unsolicited): a shadowed one that now differs wakes the loop at once."""
        d = ev.data
        found = on_param_value(self.desired, self.live, str(d["name"]), float(d["value"]), int(d["param_type"]))
        if found is None:
            return
        if self.converged:  # else a pass is at work on it, with its own reasons in the delta
            self.book.note(found.path, found.desired, found.reported, "changed on the vehicle")
            self._report_due = True
        self._wake.set()

    def on_desired(self, entry: DesiredEntry) -> None:
        if entry.revision == self.desired.revision and self._restored:
            return
        self.desired = parse_desired(entry.value, entry.revision)
        self.flight.revision_seen_mono = time.monotonic()
        self.book.reset()
        self.identity.reset_asks()
        self.live.unreadable_params.clear()
        self.converged = False
        log.info("shadow_desired", vehicle=self.vid, revision=entry.revision, fields=list(self.desired.raw),
                 errors=dict(self.desired.errors) or None)
        self._wake.set()

    def _invalidate(self, why: str) -> None:
        """Forget what was read back: the next pass reads (and if needed re-applies) everything."""
        log.info("shadow_reverify", vehicle=self.vid, reason=why)
        self.live = LiveConfig()
        self.identity.due = True
        self._verified_mono = time.monotonic()

    def _check_reboot(self) -> None:
        connects = self.vehicle.session.connects
        if connects != self._connects:
            if self._connects >= 0:
                self._invalidate("link reconnected")
            self._connects = connects
        boot_ms = self.vehicle.telemetry.last_boot_ms
        if boot_ms + 1000 < self._boot_ms:
            self._invalidate("vehicle rebooted")
        self._boot_ms = boot_ms
        if time.monotonic() - self._verified_mono > self.cfg.verify_interval_s:
            self._invalidate("periodic verify")

    async def _plan(self, name: str) -> Plan:
        return await fetch_plan(self.nats.js, name)

    def view(self) -> VehicleView:
        """The flight state the mode and armed steps decide on."""
        t = self.vehicle.telemetry
        in_recovery = t.mode in RECOVERY_MODES if t.mode else False
        return VehicleView(
            mode=t.mode, armed=t.armed, failsafe_active=t.failsafe_active, in_recovery_mode=in_recovery,
            recovery_by_autopilot=in_recovery and self.flight.recovery_entered_mono is not None,
            in_air=is_airborne(t.landed_state), link_up=self.vehicle.session.is_up,
            known_modes=tuple(t.modes.names()) if t.modes is not None else (),
        )

    # -- the loop -------------------------------------------------------------------------
    def became_owner(self) -> None:
        """This gateway (again) owns the vehicle: learn what the previous owner did before acting."""
        self._restored = False
        self._report_due = True

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._watch, name=f"vehicle[{self.vid}].shadow.watch")
            failures = 0
            while True:
                try:
                    if not self._restored:
                        await self._restore()
                    if self._report_due:
                        self._report_due = False
                        await self._report()
                    await self.reconcile_once()
                    await self._report()
                    failures = 0
                except Exception as exc:  # never into the gateway: logged, counted, retried after a backoff
                    failures += 1
                    self.metrics.errors.labels(where="shadow").inc()
                    log.warning("shadow_pass_failed", vehicle=self.vid, error=f"{type(exc).__name__}: {exc}",
                                failures=failures)
                    # NATS away or the bucket missing: back off instead of failing every tick.
                    await anyio.sleep(retry_delay_s(failures, self.cfg.retry_initial_s, self.cfg.retry_max_s))
                await self._sleep()

    async def _watch(self) -> None:
        # Delivers the current value first (a shared watch hands over the last it saw), then every change.
        await self.source.follow(self.desired_key, self.on_desired)

    async def _sleep(self) -> None:
        timeout = self.cfg.tick_s
        due = self.book.next_due_mono()
        if due is not None:
            timeout = min(timeout, max(0.0, due - time.monotonic()))
        with anyio.move_on_after(timeout):
            await self._wake.wait()
        self._wake = anyio.Event()

    async def _restore(self) -> None:
        """Learn what an earlier gateway already did (flight state is once per revision)."""
        stored = await self.writer.read()
        for fld, raw in ((stored or {}).get("applied") or {}).items():
            rec = FlightRecord.from_json(raw) if isinstance(raw, dict) else None
            if rec is not None:
                self.applied[str(fld)] = rec
        self._restored = True

    async def reconcile_once(self) -> None:
        """One pass: validate, compare, act, verify. Updates `book` and `converged`."""
        self.passes += 1
        self._check_reboot()
        d, book, session = self.desired, self.book, self.vehicle.session
        book.begin_pass()
        for path, reason in d.errors.items():
            top = path.split(".")[0].split("[")[0]
            book.note(path, d.raw.get(top) if top in d.raw else None, None, reason)
        if session.is_up:
            if self.identity.due:
                await self.identity.write(session, self.vehicle.telemetry)
            ctx = StepContext(vid=self.vid, vehicle=session, live=self.live, book=book, desired=d,
                              emit=self.vehicle.emit)
            for step in self.steps:
                try:
                    await step.apply(ctx)
                except LinkError as exc:
                    log.info("shadow_link_error", vehicle=self.vid, error=exc.reason)
                    break
        else:
            book.keep(list(book.delta.entries))
            for f in d.valid_fields:
                if f not in {p.split(".")[0] for p in book.touched}:
                    book.note(f, d.raw.get(f), None, f"link {session.state.value}: cannot check")
        book.end_pass()
        now_converged = not book.delta
        if now_converged and not self.converged:
            duration = round(time.monotonic() - self.flight.revision_seen_mono, 3)
            if d.revision:
                self.vehicle.emit(EventType.SHADOW_CONVERGED, desired_revision=d.revision, duration_s=duration)
            log.info("shadow_converged", vehicle=self.vid, revision=d.revision, duration_s=duration)
        self.converged = now_converged

    # -- reported -------------------------------------------------------------------------
    def build_reported(self, stored: dict[str, Any] | None) -> dict[str, Any]:
        if stored:
            for fld, raw in (stored.get("applied") or {}).items():
                rec = FlightRecord.from_json(raw) if isinstance(raw, dict) else None
                cur = self.applied.get(str(fld))
                if rec is not None and (cur is None or rec.revision > cur.revision):
                    self.applied[str(fld)] = rec
        return self._report_body() | {"updated": iso(time.time())}

    def _report_body(self) -> dict[str, Any]:
        d, t, live = self.desired, self.vehicle.telemetry, self.live
        doc: dict[str, Any] = {
            "desired_revision": d.revision,
            # A drift heard between passes is in the delta before a pass sees it.
            "converged": self.converged and not self.book.delta,
            "delta": self.book.delta.to_json(),
            "link": self.vehicle.session.state.value,
            "gateway": self.gateway_cfg.instance,
            "applied": {f: r.to_json() for f, r in sorted(self.applied.items())},
        }
        if d.mentions("mode"):
            doc["mode"] = t.mode
        if d.mentions("armed"):
            doc["armed"] = t.armed
        if d.mentions("params"):
            doc["params"] = {n: (fmt_number(live.params[n][0]) if n in live.params else None) for n in d.params}
        if d.mentions("mission"):
            dig = live.mission_digest
            doc["mission"] = None if dig is None else {
                "digest": dig, "count": live.mission_count,
                "object": d.mission.object if d.mission is not None and d.mission.matches(dig) else None,
            }
        if d.mentions("geofence"):
            doc["geofence"] = reported_fence(live)
        if d.mentions("rates"):
            doc["rates"] = {ch: live.rates_hz.get(ch) for ch in d.rates}
        return doc

    async def _report(self) -> None:
        body = self._report_body()
        now = time.monotonic()
        if body == self._last_report and now - self._last_report_mono < self.cfg.report_refresh_s:
            return
        await self.writer.write(self.build_reported)
        self._last_report = body
        self._last_report_mono = now
