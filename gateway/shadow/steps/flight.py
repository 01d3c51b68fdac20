"""`mode` and `armed`: flight state, acted on at most once per desired revision.

Never during a failsafe or while the autopilot holds the vehicle in a
recovery mode it chose, never a disarm in flight, never a forced arm; a
later change by a pilot or the autopilot is reported, not overridden. What
was done is kept in `applied` (saved in `reported.applied`), so a restarted
gateway does not act on the same revision again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, MutableMapping
from typing import Any

import anyio

from mavjet.contract.errors import CommandRejected, CommandTimeout
from mavjet.drivers.mavlink.modes import RECOVERY_MODES
from mavjet.gateway.shadow.config import ShadowConfig
from mavjet.gateway.shadow.diff import (
    FlightRecord,
    FlightResult,
    VehicleView,
    flight_due,
    flight_hold,
)
from mavjet.gateway.shadow.document import Desired, check_mode
from mavjet.gateway.shadow.steps.base import Finding, StepContext, Verdict, command_reason

OWN_MODE_WINDOW_S = 10.0  # a mode change this soon after we asked for that mode is ours
TEXT_WINDOW_S = 3.0  # a STATUSTEXT this recent explains a rejection (PreArm: ...)
_TEXTS_MAX = 3  # ArduPilot explains one refused arm in several lines ("PreArm: X" before the ACK, "Arm: X" after)


class FlightTracker:
    """What the flight steps learn from the vehicle's events between passes."""

    def __init__(self) -> None:
        self.revision_seen_mono = time.monotonic()  # when the current desired revision arrived
        self.recovery_entered_mono: float | None = None  # the autopilot entered a recovery mode on its own
        self.own_mode: tuple[str, float] | None = None  # (mode, monotonic) we last asked for
        self.texts: list[tuple[float, str]] = []  # recent STATUSTEXTs, oldest first
        self._changed = anyio.Event()

    def on_statustext(self, text: str, now_mono: float) -> None:
        self.texts = [t for t in self.texts if now_mono - t[0] < TEXT_WINDOW_S and t[1] != text][-(_TEXTS_MAX - 1):]
        self.texts.append((now_mono, text))

    def on_mode(self, mode: str, now_mono: float) -> None:
        own = self.own_mode is not None and self.own_mode[0] == mode and now_mono - self.own_mode[1] < OWN_MODE_WINDOW_S
        if mode in RECOVERY_MODES and not own:
            self.recovery_entered_mono = now_mono
        elif mode not in RECOVERY_MODES:
            self.recovery_entered_mono = None

    def changed(self) -> None:
        """The flight state changed (mode, armed, failsafe, link)."""
        self._changed.set()

    async def wait_changed(self) -> None:
        await self._changed.wait()
        self._changed = anyio.Event()

    def revision_seen_after_recovery(self) -> bool:
        at = self.recovery_entered_mono
        return at is not None and self.revision_seen_mono > at

    def recent_text(self, now_mono: float) -> str:
        recent = [text for at, text in self.texts if now_mono - at < TEXT_WINDOW_S]
        return f" ({'; '.join(recent)})" if recent else ""


def observe_flight(fld: str, d: Desired, view: VehicleView, record: FlightRecord | None, *,
                   revision_seen_after_recovery: bool, max_attempts: int) -> list[Finding]:
    """`mode` or `armed`: desired vs the vehicle's flight state and what was done for this revision."""
    if not d.mentions(fld) or fld in d.errors:
        return []
    want: Any = d.mode if fld == "mode" else d.armed
    live: Any = view.mode if fld == "mode" else view.armed

    def found(verdict: Verdict, reason: str = "") -> list[Finding]:
        return [Finding(path=fld, verdict=verdict, desired=want, reported=live, reason=reason)]

    if fld == "mode":
        why = check_mode(str(want), list(view.known_modes))
        if why is not None:
            return found(Verdict.HOLD, why)
    if record is not None and not flight_due(d.revision, record, max_attempts=max_attempts):
        if live == want:
            return found(Verdict.OK)
        if record.revision == d.revision and record.result == FlightResult.FAILED:
            return found(Verdict.HOLD,
                         f"gave up after {record.attempts} attempts for revision {record.revision}: {record.reason}")
        return found(Verdict.HOLD,
                     f"changed to {live} after revision {record.revision} was applied (pilot or autopilot); "
                     "reported, not overridden — write a new desired revision to apply it again")
    if live == want:
        return found(Verdict.ALREADY)
    hold = flight_hold(fld, want, view, revision_seen_after_recovery=revision_seen_after_recovery)
    if hold is not None:
        return found(Verdict.HOLD, hold)
    return found(Verdict.ACT)


class FlightStep:
    """One flight-state field (`mode` or `armed`)."""

    def __init__(self, field: str, *, cfg: ShadowConfig, tracker: FlightTracker,
                 applied: MutableMapping[str, FlightRecord], view: Callable[[], VehicleView]) -> None:
        assert field in ("mode", "armed")
        self.field = field
        self.cfg = cfg
        self.tracker = tracker
        self.applied = applied
        self.view = view

    def observe(self, d: Desired, view: VehicleView) -> list[Finding]:
        return observe_flight(self.field, d, view, self.applied.get(self.field),
                              revision_seen_after_recovery=self.tracker.revision_seen_after_recovery(),
                              max_attempts=self.cfg.flight_max_attempts)

    def _live(self) -> Any:
        v = self.view()
        return v.mode if self.field == "mode" else v.armed

    async def apply(self, ctx: StepContext) -> None:
        d, book, fld = ctx.desired, ctx.book, self.field
        found = self.observe(d, self.view())
        if not found:
            return
        f = found[0]
        want, live = f.desired, f.reported
        if f.verdict is Verdict.OK:
            book.ok(fld)
            return
        if f.verdict is Verdict.ALREADY:
            self.applied[fld] = FlightRecord(revision=d.revision, value=want, result=FlightResult.ALREADY, at_s=time.time())
            book.ok(fld)
            return
        if f.verdict is Verdict.HOLD:
            book.note(fld, want, live, f.reason)
            return
        if not book.due(fld):
            book.waiting(fld, want, live)
            return
        rec = self.applied.get(fld)
        attempts = rec.attempts + 1 if rec is not None and rec.revision == d.revision else 1
        try:
            if fld == "mode":
                self.tracker.own_mode = (str(want), time.monotonic())
                await ctx.vehicle.set_mode(str(want))
            else:
                await (ctx.vehicle.arm() if want else ctx.vehicle.disarm())
        except (CommandRejected, CommandTimeout) as exc:
            what = f"DO_SET_MODE {want}" if fld == "mode" else ("ARM" if want else "DISARM")
            reason = f"{what}: {command_reason(exc)}{self.tracker.recent_text(time.monotonic())}"
            self.applied[fld] = FlightRecord(revision=d.revision, value=want, result=FlightResult.FAILED,
                                             attempts=attempts, reason=reason, at_s=time.time())
            ctx.fail(fld, want, live, reason, threshold=min(self.cfg.fail_after_attempts, self.cfg.flight_max_attempts))
            if attempts >= self.cfg.flight_max_attempts:
                book.give_up(fld)
            return
        self.applied[fld] = FlightRecord(revision=d.revision, value=want, result=FlightResult.ACCEPTED,
                                         attempts=attempts, at_s=time.time())
        with anyio.move_on_after(self.cfg.confirm_s):
            while self._live() != want:
                await self.tracker.wait_changed()
        live = self._live()
        if live == want:
            book.ok(fld)
        else:
            book.note(fld, want, live, f"accepted, but the vehicle still reports {live} after {self.cfg.confirm_s:g} s")
