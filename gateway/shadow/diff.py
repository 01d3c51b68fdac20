"""Desired vs live: the per-field delta, flight-state rules and the retry schedule. Pure.

Two kinds of field:

- Config fields (params, mission, geofence, rates) are level-triggered: the
  reconciler compares desired with what it last read back from the vehicle
  (`LiveConfig`) and re-applies until they agree, after a reboot too. Each
  comparison is its step's `observe()` (mavjet.gateway.shadow.steps).
- Flight-state fields (mode, armed) are edge-triggered per desired revision:
  each is acted on at most once for a revision (`flight_due`), never while a
  failsafe or an autopilot-chosen recovery mode holds the vehicle
  (`flight_hold`), and a later change by a pilot or the autopilot is only
  reported. The record of what was done lives in `reported.applied`, so a
  gateway restart does not act on the same revision again.

Every field that is not as desired has a `FieldDelta` {desired, reported,
reason, attempts, since} in `reported.delta`; `since` survives while the
desired value stays the same, so it says how long the field has been off.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from mavjet.drivers.mavlink.backoff import capped_delay_s
from mavjet.drivers.mavlink.mission import MissionItem


def retry_delay_s(attempts: int, initial_s: float, max_s: float, factor: float = 2.0) -> float:
    """Capped exponential backoff after `attempts` failed attempts (0 → no wait): the one schedule."""
    return capped_delay_s(attempts, initial_s=initial_s, max_s=max_s, factor=factor)


def iso(ts_s: float) -> str:
    return dt.datetime.fromtimestamp(ts_s, tz=dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(slots=True, kw_only=True)
class FieldDelta:
    desired: Any
    reported: Any
    reason: str
    attempts: int = 0
    since_s: float = 0.0  # wall clock, seconds

    def to_json(self) -> dict[str, Any]:
        return {
            "desired": self.desired, "reported": self.reported, "reason": self.reason,
            "attempts": self.attempts, "since": iso(self.since_s),
        }


@dataclass(slots=True)
class DeltaBook:
    """The fields that are not as desired, keyed by path (`params.RTL_ALT`, `mode`, `$`)."""

    entries: dict[str, FieldDelta] = field(default_factory=dict)

    def set(self, path: str, *, desired: Any, reported: Any, reason: str, now_s: float, attempts: int | None = None) -> None:
        cur = self.entries.get(path)
        if cur is None or cur.desired != desired:
            self.entries[path] = FieldDelta(
                desired=desired, reported=reported, reason=reason, attempts=attempts or 0, since_s=now_s
            )
            return
        cur.reported, cur.reason = reported, reason
        if attempts is not None:
            cur.attempts = attempts

    def clear(self, path: str) -> None:
        self.entries.pop(path, None)

    def clear_prefix(self, prefix: str) -> None:
        for p in [p for p in self.entries if p == prefix or p.startswith(prefix + ".") or p.startswith(prefix + "[")]:
            del self.entries[p]

    def retain(self, paths: Iterable[str]) -> None:
        keep = set(paths)
        for p in [p for p in self.entries if p not in keep]:
            del self.entries[p]

    def to_json(self) -> dict[str, Any]:
        return {p: d.to_json() for p, d in sorted(self.entries.items())}

    def __bool__(self) -> bool:
        return bool(self.entries)


@dataclass(slots=True, kw_only=True)
class LiveConfig:
    """Config as last read back from the vehicle (None: not read yet)."""

    params: dict[str, tuple[float, int]] = field(default_factory=dict)  # name -> (value, MAV_PARAM_TYPE)
    unreadable_params: set[str] = field(default_factory=set)  # no PARAM_VALUE answered a read
    mission_digest: str | None = None
    mission_count: int | None = None
    fence_digest: str | None = None
    fence_items: list[MissionItem] | None = None  # the FENCE items downloaded (None: not read yet)
    rates_hz: dict[str, float] = field(default_factory=dict)


# -- flight state ---------------------------------------------------------------


class FlightResult(StrEnum):
    ACCEPTED = "accepted"  # the command was accepted
    ALREADY = "already"  # the vehicle was already as desired
    FAILED = "failed"  # rejected or unanswered; retried until flight_max_attempts
    HELD = "held"  # not acted on; not written by this version, honoured when read back


@dataclass(frozen=True, slots=True, kw_only=True)
class FlightRecord:
    """What the reconciler did about one flight-state field for one desired revision."""

    revision: int
    value: Any
    result: str  # a FlightResult; a record read back may hold any string
    attempts: int = 1
    reason: str = ""
    at_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"revision": self.revision, "value": self.value, "result": self.result,
                               "attempts": self.attempts, "at": iso(self.at_s)}
        if self.reason:
            out["reason"] = self.reason
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> FlightRecord | None:
        try:
            at = dt.datetime.fromisoformat(str(raw.get("at", "1970-01-01T00:00:00Z")).replace("Z", "+00:00"))
            return cls(
                revision=int(raw["revision"]), value=raw.get("value"), result=str(raw.get("result", "accepted")),
                attempts=int(raw.get("attempts", 1)), reason=str(raw.get("reason", "")), at_s=at.timestamp(),
            )
        except (KeyError, TypeError, ValueError):
            return None


def flight_due(revision: int, record: FlightRecord | None, *, max_attempts: int) -> bool:
    """May the reconciler act on this field for `revision`?

    Once per revision: a record for this revision means it was acted on,
    except a failed or held attempt, which may be retried (after backoff,
    decided by the caller) until `max_attempts`.
    """
    if record is None or record.revision < revision:
        return True
    if record.revision > revision:
        return False
    if record.result == FlightResult.HELD:
        return True
    return record.result == FlightResult.FAILED and record.attempts < max_attempts


@dataclass(frozen=True, slots=True, kw_only=True)
class VehicleView:
    """The live flight state the gating rules need (from the telemetry model)."""

    mode: str | None
    armed: bool | None
    failsafe_active: bool
    in_recovery_mode: bool  # the vehicle is in a mode like RTL or LAND
    recovery_by_autopilot: bool  # ... and it entered it on its own (not on our request)
    in_air: bool
    link_up: bool
    known_modes: tuple[str, ...] = ()  # the vehicle's mode table (empty: no HEARTBEAT yet)


def flight_hold(fld: str, value: Any, v: VehicleView, *, revision_seen_after_recovery: bool) -> str | None:
    """Why the reconciler must not act on `fld` now (None: it may)."""
    if not v.link_up:
        return "link down"
    if v.failsafe_active:
        return f"failsafe active (vehicle in {v.mode}); flight state is not changed during a failsafe"
    if v.in_recovery_mode and v.recovery_by_autopilot and not revision_seen_after_recovery:
        return f"the autopilot switched to {v.mode} on its own; not overridden"
    if fld == "armed" and value is False and v.in_air:
        return "in flight: the reconciler never disarms an airborne vehicle"
    return None
