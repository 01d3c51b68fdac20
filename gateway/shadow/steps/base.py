"""What every shadow step shares: the verdict of `observe()` and the pass context.

A step owns one desired field. `observe()` is the diff: pure, fed with the
parsed desired document and what was last read back, it returns one
`Finding` per path. `apply()` does the I/O: it reads what is not known yet,
observes again, and acts on what differs when the retry book says it is due.
Production runs the same `observe()` the unit tests call.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

import structlog

from mavjet.contract.errors import CommandRejected, CommandTimeout
from mavjet.contract.events import EventType
from mavjet.drivers.mavlink.command import mav_result_name
from mavjet.drivers.mavlink.session import Session
from mavjet.gateway.shadow.book import RetryBook
from mavjet.gateway.shadow.diff import LiveConfig
from mavjet.gateway.shadow.document import Desired

log = structlog.get_logger("mavjet.shadow")


class Verdict(StrEnum):
    OK = "ok"  # as desired
    ALREADY = "already"  # flight state already as desired before anything was sent (recorded as done)
    UNKNOWN = "unknown"  # the live value has not been read: apply() reads it, then observes again
    HOLD = "hold"  # not as desired, and not to be acted on now; `reason` says why
    ACT = "act"  # not as desired: apply() writes it when the retry book says it is due


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    path: str  # the delta path: `params.RTL_ALT`, `mission`, `geofence`, `rates.position`, `mode`, `armed`
    verdict: Verdict
    desired: Any = None
    reported: Any = None
    reason: str = ""  # HOLD: why; ACT: what differs (used in failure reasons)
    key: str = ""  # the item inside the field: parameter name, rate channel


def fmt_number(value: float) -> float | int:
    """Numbers as an operator wrote them: 2000, not 2000.0."""
    return int(value) if float(value).is_integer() else value


class Emit(Protocol):
    def __call__(self, etype: EventType, **data: Any) -> None: ...


@dataclass(slots=True, kw_only=True)
class StepContext:
    """What one pass gives every step."""

    vid: str
    vehicle: Session  # errors are the drivers' own; a LinkError ends the pass
    live: LiveConfig
    book: RetryBook
    desired: Desired
    emit: Emit

    def fail(self, path: str, desired: Any, reported: Any, reason: str, *, threshold: int | None = None) -> None:
        """An attempt failed: back off, and announce `shadow_failed` once per revision past the threshold."""
        rev = self.desired.revision
        if self.book.fail(path, desired, reported, reason, revision=rev, threshold=threshold):
            self.emit(EventType.SHADOW_FAILED, desired_revision=rev, field=path, reason=reason)
        log.warning("shadow_field_failed", vehicle=self.vid, field=path, attempts=self.book.attempts.get(path),
                    reason=reason)


class Step(Protocol):
    """One desired field: `observe()` is pure, `apply()` does the I/O and writes the retry book."""

    field: str

    async def apply(self, ctx: StepContext) -> None: ...


def command_reason(exc: CommandRejected | CommandTimeout) -> str:
    if isinstance(exc, CommandRejected):
        return f"rejected ({mav_result_name(exc.result)})"
    return f"no COMMAND_ACK after {exc.attempts} attempts"
