"""One vehicle's shadow controller: desired → vehicle, vehicle → reported.

A pass compares the desired document with what was last read back from the
vehicle and acts on what differs, through the MAVLink protocol runners
(drivers.mavlink.runner): `set_param`, `upload_and_verify`, `apply_geofence`,
commands for stream rates, mode and arming. Passes run when the desired
document changes, when the vehicle does something relevant (link restored,
mode change, failsafe), when a retry is due, and on an idle tick. A pass on a
converged vehicle does no MAVLink I/O; everything it would read is cached in
`LiveConfig` until a reboot, a reconnect or `verify_interval_s` clears it, and
then it is read back again (level-triggered: re-applied if it drifted).

Safety (DESIGN.md, Shadow): flight state is acted on at most once per desired
revision, never during a failsafe or while the autopilot holds the vehicle in
a recovery mode it chose, never disarms in flight, and never forces arming;
failed attempts are retried only after a capped backoff and a bounded number
of times. What was done is recorded in `reported.applied`, so a restarted
gateway does not repeat it.

The reconciler never raises into the gateway: every error becomes a reason
in `reported.delta`, a log line and a later retry.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import anyio
import structlog

from drivers.mavlink.command import CommandResult, mav_result_name
from drivers.mavlink.dialect import mavlink2
from drivers.mavlink.fence import Geofence
from drivers.mavlink.mission import FENCE, MISSION, MissionItem
from drivers.mavlink.modes import RECOVERY_MODES, Flavour
from drivers.mavlink.params import ParamMismatch, ParamTimeout, values_equal
from drivers.mavlink.plan import digest, parse_plan
from drivers.mavlink.runner import (
    DEFAULT_CONFIG,
    ProtocolConfig,
    apply_geofence,
    download_mission,
    execute_command,
    read_param,
    run_command,
    set_param,
    upload_and_verify,
)
from gateway.contract.errors import CommandRejected, CommandTimeout, LinkError, MavjetError
from gateway.contract.subjects import BLOBS_BUCKET, shadow_key
from gateway.shadow.config import ShadowConfig
from gateway.shadow.diff import (
    DeltaBook,
    FlightRecord,
    LiveConfig,
    VehicleView,
    flight_due,
    flight_hold,
    iso,
    retry_delay_s,
)
from gateway.shadow.document import EMPTY, Desired, check_mode, check_param, parse_desired
from gateway.shadow.fence import fence_to_json, interval_us, rate_matches, rate_message
from gateway.shadow.kvstore import DesiredEntry, ReportedWriter, ShadowStore, watch_key
from gateway.telemetry import Event
from gateway.vehicle import VehicleTwin

log = structlog.get_logger("mavjet.shadow")

_WAKE_EVENTS = frozenset({"link_restored", "link_lost", "mode_changed", "armed", "disarmed", "failsafe"})
_OWN_MODE_WINDOW_S = 10.0  # a mode change this soon after we asked for that mode is ours
_TEXT_WINDOW_S = 3.0  # a STATUSTEXT this recent explains a rejection (PreArm: ...)


def _fmt(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


class VehicleReconciler:
    def __init__(
        self,
        twin: VehicleTwin,
        store: ShadowStore,
        cfg: ShadowConfig,
        *,
        protocols: ProtocolConfig = DEFAULT_CONFIG,
    ) -> None:
        self.twin = twin
        self.vid = twin.vid
        self.store = store
        self.cfg = cfg
        self.protocols = protocols
        env = twin.cfg.env
        self.desired_key = shadow_key(env, self.vid, "desired")
        self.writer = ReportedWriter(store, shadow_key(env, self.vid, "reported"), max_conflicts=cfg.max_conflicts)
        self.meta_key = shadow_key(env, self.vid, "meta")
        self.config_key = shadow_key(env, self.vid, "config")
        self.desired: Desired = EMPTY
        self.live = LiveConfig()
        self.fence_items: list[MissionItem] | None = None
        self.book = DeltaBook()
        self.applied: dict[str, FlightRecord] = {}
        self.converged = False
        self.passes = 0
        self._paths: set[str] = set()
        self._attempts: dict[str, int] = {}
        self._next_try: dict[str, float] = {}
        self._failed_emitted: set[tuple[int, str]] = set()
        self._unknown_params: set[str] = set()
        self._wake = anyio.Event()
        self._changed = anyio.Event()  # the vehicle's flight state changed (mode, armed, failsafe)
        self._revision_seen_mono = time.monotonic()
        self._recovery_entered_mono: float | None = None
        self._own_mode: tuple[str, float] | None = None
        self._last_text: tuple[float, str] | None = None
        self._verified_mono = time.monotonic()
        self._last_report: dict[str, Any] | None = None
        self._last_report_mono = 0.0
        self._connects = -1
        self._boot_ms = 0
        self._meta_due = True
        self._restored = False
        twin.on_event_hooks.append(self._on_event)

    # -- inputs -------------------------------------------------------------------------
    def _on_event(self, ev: Event) -> None:
        if ev.type not in _WAKE_EVENTS and ev.type != "statustext":
            return
        now = time.monotonic()
        if ev.type == "statustext":
            self._last_text = (now, str(ev.data.get("text", "")))
            return
        if ev.type == "mode_changed":
            mode = str(ev.data.get("mode"))
            own = self._own_mode is not None and self._own_mode[0] == mode and now - self._own_mode[1] < _OWN_MODE_WINDOW_S
            if mode in RECOVERY_MODES and not own:
                self._recovery_entered_mono = now
            elif mode not in RECOVERY_MODES:
                self._recovery_entered_mono = None
        if ev.type == "link_restored":
            self._invalidate("link restored")
        self._changed.set()
        self._wake.set()

    def on_desired(self, entry: DesiredEntry) -> None:
        if entry.revision == self.desired.revision and self._restored:
            return
        self.desired = parse_desired(entry.value, entry.revision)
        self._revision_seen_mono = time.monotonic()
        self._attempts.clear()
        self._next_try.clear()
        self._unknown_params.clear()
        self.converged = False
        log.info("shadow_desired", vehicle=self.vid, revision=entry.revision, fields=list(self.desired.raw),
                 errors=dict(self.desired.errors) or None)
        self._wake.set()

    def _invalidate(self, why: str) -> None:
        """Forget what was read back: the next pass reads (and if needed re-applies) everything."""
        log.info("shadow_reverify", vehicle=self.vid, reason=why)
        self.live = LiveConfig()
        self.fence_items = None
        self._unknown_params.clear()
        self._meta_due = True
        self._verified_mono = time.monotonic()

    def _check_reboot(self) -> None:
        link = self.twin.link
        if link.stats.connects != self._connects:
            if self._connects >= 0:
                self._invalidate("link reconnected")
            self._connects = link.stats.connects
        boot_ms = int(getattr(self.twin.model, "_last_boot_ms", 0) or 0)
        if boot_ms + 1000 < self._boot_ms:
            self._invalidate("vehicle rebooted")
        self._boot_ms = boot_ms
        if time.monotonic() - self._verified_mono > self.cfg.verify_interval_s:
            self._invalidate("periodic verify")

    # -- bookkeeping ----------------------------------------------------------------------
    def _due(self, path: str) -> bool:
        return time.monotonic() >= self._next_try.get(path, 0.0)

    def _ok(self, path: str) -> None:
        self._attempts.pop(path, None)
        self._next_try.pop(path, None)
        self.book.clear(path)
        self._paths.discard(path)

    def _note(self, path: str, desired: Any, reported: Any, reason: str) -> None:
        """Not as desired, and nothing was attempted (validation, hold, waiting for a retry)."""
        self._paths.add(path)
        self.book.set(path, desired=desired, reported=reported, reason=reason, now_s=time.time())

    def _fail(self, path: str, desired: Any, reported: Any, reason: str, *, threshold: int | None = None) -> None:
        n = self._attempts.get(path, 0) + 1
        self._attempts[path] = n
        self._next_try[path] = time.monotonic() + retry_delay_s(n, self.cfg.retry_initial_s, self.cfg.retry_max_s)
        self._paths.add(path)
        self.book.set(path, desired=desired, reported=reported, reason=reason, now_s=time.time(), attempts=n)
        rev = self.desired.revision
        if n >= (threshold or self.cfg.fail_after_attempts) and (rev, path) not in self._failed_emitted:
            self._failed_emitted.add((rev, path))
            if len(self._failed_emitted) > 1024:
                self._failed_emitted.clear()
            self.twin.emit("shadow_failed", desired_revision=rev, field=path, reason=reason)
        log.warning("shadow_field_failed", vehicle=self.vid, field=path, attempts=n, reason=reason)

    def _waiting(self, path: str, desired: Any, reported: Any) -> None:
        cur = self.book.entries.get(path)
        reason = cur.reason if cur is not None else "waiting to retry"
        self._note(path, desired, reported, reason)

    # -- the loop -------------------------------------------------------------------------
    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._watch, name=f"vehicle[{self.vid}].shadow.watch")
            failures = 0
            while True:
                try:
                    if not self._restored:
                        await self._restore()
                    await self.reconcile_once()
                    await self._report()
                    failures = 0
                except Exception as exc:
                    if isinstance(exc, asyncio.CancelledError):
                        raise
                    failures += 1
                    self.twin.metrics.errors.labels(where="shadow").inc()
                    log.warning("shadow_pass_failed", vehicle=self.vid, error=f"{type(exc).__name__}: {exc}",
                                failures=failures)
                    # NATS away or the bucket missing: back off instead of failing every tick.
                    await anyio.sleep(retry_delay_s(failures, self.cfg.retry_initial_s, self.cfg.retry_max_s))
                await self._sleep()

    async def _watch(self) -> None:
        await watch_key(self.store, self.desired_key, self.on_desired, resync_interval_s=self.cfg.resync_interval_s)

    async def _sleep(self) -> None:
        now = time.monotonic()
        timeout = self.cfg.tick_s
        if self._next_try:
            timeout = min(timeout, max(0.0, min(self._next_try.values()) - now))
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
        d = self.desired
        self._paths = set()
        for path, reason in d.errors.items():
            top = path.split(".")[0].split("[")[0]
            self._note(path, d.raw.get(top) if top in d.raw else None, None, reason)
        if self.twin.link.is_up:
            if self._meta_due:
                await self._write_identity()
            steps = (self._params, self._mission, self._geofence, self._rates, self._flight)
            for step in steps:
                try:
                    await step(d)
                except LinkError as exc:
                    log.info("shadow_link_error", vehicle=self.vid, error=exc.reason)
                    break
        else:
            for path in list(self.book.entries):
                self._paths.add(path)
            for f in d.valid_fields:
                if f not in {p.split(".")[0] for p in self._paths}:
                    self._note(f, d.raw.get(f), None, f"link {self.twin.link.state.value}: cannot check")
        self.book.retain(self._paths)
        now_converged = not self.book
        if now_converged and not self.converged:
            duration = round(time.monotonic() - self._revision_seen_mono, 3)
            if d.revision:
                self.twin.emit("shadow_converged", desired_revision=d.revision, duration_s=duration)
            log.info("shadow_converged", vehicle=self.vid, revision=d.revision, duration_s=duration)
        self.converged = now_converged

    # -- params ---------------------------------------------------------------------------
    async def _known(self, name: str, path: str, want: float) -> tuple[float, int] | None:
        """The param's live (value, type), reading it if needed; None (noted) if unknown."""
        got = self.live.params.get(name)
        if got is not None:
            return got
        if name in self._unknown_params and not self._due(path):
            self._waiting(path, _fmt(want), None)
            return None
        try:
            pv = await read_param(self.twin.link, name, config=self.protocols)
        except ParamTimeout:
            self._unknown_params.add(name)
            self._fail(path, _fmt(want), None, check_param(name, want, None) or "unknown parameter")
            return None
        self._unknown_params.discard(name)
        self.live.params[name] = (pv.value, pv.param_type)
        return self.live.params[name]

    async def _params(self, d: Desired) -> None:
        for name, want in d.params.items():
            path = f"params.{name}"
            if path in d.errors:
                continue
            got = await self._known(name, path, want)
            if got is None:
                continue
            value, ptype = got
            why = check_param(name, want, ptype)
            if why is not None:
                self._note(path, _fmt(want), _fmt(value), why)
                continue
            if values_equal(want, value, ptype):
                self._ok(path)
                continue
            if not self._due(path):
                self._waiting(path, _fmt(want), _fmt(value))
                continue
            try:
                pv = await set_param(self.twin.link, name, want, param_type=ptype, config=self.protocols)
            except ParamMismatch as exc:
                self.live.params[name] = (exc.reported, ptype)
                self._fail(path, _fmt(want), _fmt(exc.reported),
                           f"the vehicle kept {exc.reported:g} after {exc.attempts} PARAM_SETs (rejected or clamped)")
                continue
            except ParamTimeout as exc:
                self.live.params.pop(name, None)
                self._fail(path, _fmt(want), _fmt(value), f"no PARAM_VALUE after {exc.attempts} PARAM_SETs")
                continue
            self.live.params[name] = (pv.value, ptype)
            if values_equal(want, pv.value, ptype):
                self._ok(path)
            else:
                self._fail(path, _fmt(want), _fmt(pv.value), f"the vehicle reports {pv.value:g}")

    # -- mission --------------------------------------------------------------------------
    async def _mission(self, d: Desired) -> None:
        spec = d.mission
        if spec is None or "mission" in d.errors:
            return
        path = "mission"
        if self.live.mission_digest is None:
            try:
                items = await download_mission(self.twin.link, MISSION, config=self.protocols)
            except LinkError:
                raise
            except MavjetError as exc:
                self._fail(path, spec.digest, None, f"mission download failed: {exc}")
                return
            self.live.mission_digest = digest(items)
            self.live.mission_count = len(items)
        if spec.matches(self.live.mission_digest):
            self._ok(path)
            return
        if not self._due(path):
            self._waiting(path, spec.digest, self.live.mission_digest)
            return
        js = self.twin.publisher.js
        if js is None:
            self._note(path, spec.digest, self.live.mission_digest, "NATS not connected: cannot fetch the mission")
            return
        try:
            obs = await js.object_store(BLOBS_BUCKET)
            obj = await obs.get(spec.object)
            data = obj.data or b""
        except Exception as exc:
            if isinstance(exc, asyncio.CancelledError):
                raise
            self._fail(path, spec.digest, self.live.mission_digest,
                       f"cannot read {spec.object!r} from {BLOBS_BUCKET}: {type(exc).__name__} {exc}".strip())
            return
        try:
            plan = parse_plan(data)
        except MavjetError as exc:
            self._fail(path, spec.digest, self.live.mission_digest, f"{spec.object}: {exc}")
            return
        if not spec.matches(plan.mission_digest):
            self._fail(path, spec.digest, self.live.mission_digest,
                       f"{spec.object} has mission digest {plan.mission_digest[:16]}, desired says {spec.digest[:16]}")
            return
        try:
            got = await upload_and_verify(self.twin.link, plan.mission, MISSION, config=self.protocols)
        except LinkError:
            raise
        except MavjetError as exc:
            self.live.mission_digest = None  # unknown after a failed transfer: read it back next time
            self._fail(path, spec.digest, None, f"mission upload failed: {exc}")
            return
        self.live.mission_digest = got
        self.live.mission_count = len(plan.mission)
        self.twin.emit("mission_uploaded", object=spec.object, digest=got, count=len(plan.mission))
        self._ok(path)

    # -- geofence -------------------------------------------------------------------------
    async def _geofence(self, d: Desired) -> None:
        g: Geofence | None = d.geofence
        if g is None or any(p.startswith("geofence") for p in d.errors):
            return
        path = "geofence"
        if self.fence_items is None:
            try:
                self.fence_items = await download_mission(self.twin.link, FENCE, config=self.protocols)
            except LinkError:
                raise
            except MavjetError as exc:
                self._fail(path, g.digest, None, f"fence download failed: {exc}")
                return
            self.live.fence_digest = digest(self.fence_items)
        want_params = g.params()
        off: list[str] = []
        for name, want in want_params.items():
            got = await self._known(name, path, want)
            if got is None:
                return
            if not values_equal(want, got[0], got[1]):
                off.append(f"{name}={_fmt(got[0])} (want {_fmt(want)})")
        if self.live.fence_digest != g.digest:
            off.insert(0, f"zones digest {str(self.live.fence_digest)[:12]} (want {g.digest[:12]})")
        reported = self._reported_fence()
        if not off:
            self._ok(path)
            return
        if not self._due(path):
            self._waiting(path, g.digest, reported)
            return
        try:
            got_digest = await apply_geofence(self.twin.link, g, config=self.protocols)
        except LinkError:
            raise
        except MavjetError as exc:
            self.fence_items = None
            for name in want_params:
                self.live.params.pop(name, None)
            self._fail(path, g.digest, reported, f"geofence not applied ({'; '.join(off)}): {exc}")
            return
        self.fence_items = list(g.items())
        self.live.fence_digest = got_digest
        for name, want in want_params.items():
            ptype = self.live.params.get(name, (0.0, mavlink2.MAV_PARAM_TYPE_REAL32))[1]
            self.live.params[name] = (want, ptype)
        self._ok(path)

    def _reported_fence(self) -> dict[str, Any] | None:
        if self.fence_items is None:
            return None
        names = ("FENCE_ENABLE", "FENCE_TYPE", "FENCE_ACTION", "FENCE_ALT_MAX")
        params = {n: self.live.params[n][0] for n in names if n in self.live.params}
        return fence_to_json(self.fence_items, params)

    # -- stream rates ---------------------------------------------------------------------
    async def _request_reply(self, command: int, params: tuple[float, ...], reply: str, match: Any) -> Any:
        """Send a command and return the first `reply` message accepted by `match` (None on timeout)."""
        port = self.twin.link
        found: Any = None
        with anyio.move_on_after(self.cfg.request_timeout_s + self.protocols.command.ack_timeout_s * 3):
            async with port.listen(512) as rx, anyio.create_task_group() as tg:

                async def wait_reply() -> None:
                    nonlocal found
                    async for msg in rx:
                        if msg.get_type() == reply and match(msg):
                            found = msg
                            tg.cancel_scope.cancel()
                            return

                tg.start_soon(wait_reply)
                outcome = await execute_command(port, command, params, config=self.protocols)
                if outcome.result is not CommandResult.ACCEPTED:
                    tg.cancel_scope.cancel()
                    return None
                await anyio.sleep(self.cfg.request_timeout_s)
                tg.cancel_scope.cancel()
        return found

    async def _read_rate(self, msg_id: int) -> float | None:
        msg = await self._request_reply(
            mavlink2.MAV_CMD_GET_MESSAGE_INTERVAL, (float(msg_id),), "MESSAGE_INTERVAL",
            lambda m: int(m.message_id) == msg_id,
        )
        if msg is None:
            return None
        iv = int(msg.interval_us)
        return 1e6 / iv if iv > 0 else 0.0

    async def _rates(self, d: Desired) -> None:
        for ch, hz in d.rates.items():
            path = f"rates.{ch}"
            if path in d.errors:
                continue
            rm = rate_message(ch)
            if rm is None:
                self._note(path, hz, None, f"{ch} is not a MAVLink message this gateway knows")
                continue
            name, msg_id = rm
            if ch not in self.live.rates_hz:
                got = await self._read_rate(msg_id)
                if got is not None:
                    self.live.rates_hz[ch] = round(got, 3)
            current = self.live.rates_hz.get(ch)
            if current is not None and rate_matches(hz, current):
                self._ok(path)
                continue
            if not self._due(path):
                self._waiting(path, hz, current)
                continue
            try:
                await run_command(self.twin.link, mavlink2.MAV_CMD_SET_MESSAGE_INTERVAL,
                                  (float(msg_id), float(interval_us(hz))), config=self.protocols)
            except (CommandRejected, CommandTimeout) as exc:
                self._fail(path, hz, current, f"SET_MESSAGE_INTERVAL for {name}: {_command_reason(exc)}")
                continue
            got = await self._read_rate(msg_id)
            if got is None:
                # No GET_MESSAGE_INTERVAL on this autopilot: the accepted SET is the best evidence.
                self.live.rates_hz[ch] = hz
                self._ok(path)
            elif rate_matches(hz, got):
                self.live.rates_hz[ch] = round(got, 3)
                self._ok(path)
            else:
                self.live.rates_hz[ch] = round(got, 3)
                self._fail(path, hz, round(got, 3), f"{name} interval reads back as {got:g} Hz")

    # -- flight state ---------------------------------------------------------------------
    def _view(self) -> VehicleView:
        m = self.twin.model
        in_recovery = m.mode in RECOVERY_MODES if m.mode else False
        return VehicleView(
            mode=m.mode, armed=m.armed, failsafe_active=m.failsafe_active, in_recovery_mode=in_recovery,
            recovery_by_autopilot=in_recovery and self._recovery_entered_mono is not None,
            in_air=m.landed_state in (mavlink2.MAV_LANDED_STATE_IN_AIR, mavlink2.MAV_LANDED_STATE_TAKEOFF,
                                      mavlink2.MAV_LANDED_STATE_LANDING),
            link_up=self.twin.link.is_up,
        )

    async def _flight(self, d: Desired) -> None:
        m = self.twin.model
        for fld in ("mode", "armed"):
            if not d.mentions(fld) or fld in d.errors:
                continue
            want: Any = d.mode if fld == "mode" else d.armed
            live: Any = m.mode if fld == "mode" else m.armed
            if fld == "mode":
                why = check_mode(str(want), m.modes.names() if m.modes is not None else [])
                if why is not None:
                    self._note(fld, want, live, why)
                    continue
            rec = self.applied.get(fld)
            if not flight_due(d.revision, rec, max_attempts=self.cfg.flight_max_attempts):
                assert rec is not None
                if live == want:
                    self._ok(fld)
                elif rec.revision == d.revision and rec.result == "failed":
                    self._note(fld, want, live,
                               f"gave up after {rec.attempts} attempts for revision {rec.revision}: {rec.reason}")
                else:
                    self._note(fld, want, live,
                               f"changed to {live} after revision {rec.revision} was applied (pilot or autopilot); "
                               "reported, not overridden — write a new desired revision to apply it again")
                continue
            if live == want:
                self.applied[fld] = FlightRecord(revision=d.revision, value=want, result="already", at_s=time.time())
                self._ok(fld)
                continue
            recovery_at = self._recovery_entered_mono
            hold = flight_hold(fld, want, self._view(),
                               revision_seen_after_recovery=recovery_at is not None and self._revision_seen_mono > recovery_at)
            if hold is not None:
                self._note(fld, want, live, hold)
                continue
            if not self._due(fld):
                self._waiting(fld, want, live)
                continue
            attempts = rec.attempts + 1 if rec is not None and rec.revision == d.revision else 1
            try:
                if fld == "mode":
                    await self._set_mode(str(want))
                else:
                    await self._set_armed(bool(want))
            except (CommandRejected, CommandTimeout) as exc:
                reason = f"{'DO_SET_MODE ' + str(want) if fld == 'mode' else ('ARM' if want else 'DISARM')}: {_command_reason(exc)}"
                reason += self._recent_text()
                self.applied[fld] = FlightRecord(revision=d.revision, value=want, result="failed", attempts=attempts,
                                                 reason=reason, at_s=time.time())
                self._fail(fld, want, live, reason, threshold=min(self.cfg.fail_after_attempts, self.cfg.flight_max_attempts))
                if attempts >= self.cfg.flight_max_attempts:
                    self._next_try.pop(fld, None)
                continue
            self.applied[fld] = FlightRecord(revision=d.revision, value=want, result="accepted", attempts=attempts,
                                             at_s=time.time())
            with anyio.move_on_after(self.cfg.confirm_s):
                while (m.mode if fld == "mode" else m.armed) != want:
                    await self._changed.wait()
                    self._changed = anyio.Event()
            live = m.mode if fld == "mode" else m.armed
            if live == want:
                self._ok(fld)
            else:
                self._note(fld, want, live, f"accepted, but the vehicle still reports {live} after {self.cfg.confirm_s:g} s")

    def _recent_text(self) -> str:
        t = self._last_text
        if t is not None and time.monotonic() - t[0] < _TEXT_WINDOW_S:
            return f" ({t[1]})"
        return ""

    async def _set_mode(self, mode: str) -> None:
        m = self.twin.model
        assert m.modes is not None
        custom = m.modes.custom_mode(mode)
        flag = float(mavlink2.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED)
        if m.modes.flavour is Flavour.PX4:
            params: tuple[float, ...] = (flag, float((custom >> 16) & 0xFF), float((custom >> 24) & 0xFF))
        else:
            params = (flag, float(custom))
        self._own_mode = (mode, time.monotonic())
        await run_command(self.twin.link, mavlink2.MAV_CMD_DO_SET_MODE, params, config=self.protocols)

    async def _set_armed(self, armed: bool) -> None:
        # Never forced (param2 = 0): a refusal by the pre-arm checks is the answer, not an obstacle.
        await run_command(self.twin.link, mavlink2.MAV_CMD_COMPONENT_ARM_DISARM, (1.0 if armed else 0.0, 0.0),
                          config=self.protocols)

    # -- identity -------------------------------------------------------------------------
    async def _write_identity(self) -> None:
        m = self.twin.model
        link = self.twin.link
        cfg = self.twin.cfg
        now = iso(time.time())
        config_doc = {
            "vid": self.vid, "env": cfg.env, "gateway": cfg.instance, "endpoint": str(link.endpoint),
            "sysid": link.target_system, "compid": link.target_component, "state_rates_hz": dict(cfg.rates_hz),
            "streams_hz": dict(cfg.link.streams_hz), "heartbeat_timeout_s": cfg.link.heartbeat_timeout_s,
            "updated": now,
        }
        meta: dict[str, Any] = {
            "vid": self.vid, "sysid": link.target_system, "type": m.vehicle_class, "flavour": m.flavour, "updated": now,
        }
        msg = await self._request_reply(
            mavlink2.MAV_CMD_REQUEST_MESSAGE, (float(mavlink2.MAVLINK_MSG_ID_AUTOPILOT_VERSION),),
            "AUTOPILOT_VERSION", lambda _m: True,
        )
        if msg is not None:
            meta.update(autopilot_version_fields(msg))
        else:
            meta["firmware"] = None
            meta["note"] = "no AUTOPILOT_VERSION answer"
        try:
            await self.store.put(self.config_key, config_doc)
            await self.store.put(self.meta_key, meta)
        except Exception as exc:
            if isinstance(exc, asyncio.CancelledError):
                raise
            log.warning("shadow_identity_write_failed", vehicle=self.vid, error=f"{type(exc).__name__}: {exc}")
            return
        self._meta_due = msg is None and self._meta_due_retry()

    def _meta_due_retry(self) -> bool:
        """Ask for AUTOPILOT_VERSION again on a later pass only a few times."""
        n = self._attempts.get("$meta", 0) + 1
        self._attempts["$meta"] = n
        return n < 3

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
        d, m = self.desired, self.twin.model
        doc: dict[str, Any] = {
            "desired_revision": d.revision,
            "converged": self.converged,
            "delta": self.book.to_json(),
            "link": self.twin.link.state.value,
            "gateway": self.twin.cfg.instance,
            "applied": {f: r.to_json() for f, r in sorted(self.applied.items())},
        }
        if d.mentions("mode"):
            doc["mode"] = m.mode
        if d.mentions("armed"):
            doc["armed"] = m.armed
        if d.mentions("params"):
            doc["params"] = {
                n: (_fmt(self.live.params[n][0]) if n in self.live.params else None) for n in d.params
            }
        if d.mentions("mission"):
            dig = self.live.mission_digest
            doc["mission"] = None if dig is None else {
                "digest": dig, "count": self.live.mission_count,
                "object": d.mission.object if d.mission is not None and d.mission.matches(dig) else None,
            }
        if d.mentions("geofence"):
            doc["geofence"] = self._reported_fence()
        if d.mentions("rates"):
            doc["rates"] = {ch: self.live.rates_hz.get(ch) for ch in d.rates}
        return doc

    async def _report(self) -> None:
        body = self._report_body()
        now = time.monotonic()
        if body == self._last_report and now - self._last_report_mono < self.cfg.report_refresh_s:
            return
        await self.writer.write(self.build_reported)
        self._last_report = body
        self._last_report_mono = now


def _command_reason(exc: CommandRejected | CommandTimeout) -> str:
    if isinstance(exc, CommandRejected):
        return f"rejected ({mav_result_name(exc.result)})"
    return f"no COMMAND_ACK after {exc.attempts} attempts"


def autopilot_version_fields(msg: Any) -> dict[str, Any]:
    """meta fields from AUTOPILOT_VERSION: firmware version, serial (uid/uid2), board ids."""
    sw = int(msg.flight_sw_version)
    types = {0: "dev", 64: "alpha", 128: "beta", 192: "rc", 255: "official"}
    uid2 = bytes(int(b) & 0xFF for b in getattr(msg, "uid2", []) or [])
    uid2_text = uid2.rstrip(b"\0").decode("ascii", "replace") if any(uid2) else ""
    out: dict[str, Any] = {
        "firmware": f"{(sw >> 24) & 0xFF}.{(sw >> 16) & 0xFF}.{(sw >> 8) & 0xFF}",
        "firmware_type": types.get(sw & 0xFF, str(sw & 0xFF)),
        "uid": f"{int(msg.uid):016x}",
        "serial": uid2_text if uid2_text.isprintable() and uid2_text else f"{int(msg.uid):016x}",
        "board_version": int(msg.board_version),
        "vendor_id": int(msg.vendor_id),
        "product_id": int(msg.product_id),
        "capabilities": int(msg.capabilities),
    }
    return out
