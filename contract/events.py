"""The catalogue of event types: one entry per type, every rule about it in one place. Pure.

An event's name used to be a free string whose rules sat in the modules that
used them: the spool's priority table, the event budget's exemptions, the
analytics' command effects and flight split, and the literals at each
`emit()`. Here each type is one `EventSpec`:

- `fields`: the type-specific keys of its `data` that are always there, and
  `optional` the ones that are only sometimes there (docs/events.md; the
  vehicle snapshot, `SNAPSHOT_FIELDS`, comes on top; `more` when a type
  carries keys of its own beyond these, as a `cmd_result` its command's);
- `spool`: what it is worth when the spool is over its bound;
- `budget_exempt`: never held back by the per-vehicle event budget;
- `confirms`: the commands whose effect it is, each with how long after the
  command it still counts as that effect (analytics' command chains);
- `flight`: whether it starts or ends a flight (analytics' flight split);
- `internal`: for in-gateway subscribers only, never published.

Every module that emits, classifies or reads an event type takes it from
here (`EventType`), and `tests/test_events_catalogue.py` fails on a name
spelled as a literal elsewhere, an emit site whose type is not listed, or a
rule naming a type the catalogue does not know; what a gateway really
publishes in a sortie is held to the fields here by
`tests/commands/test_events_emitted.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from mavjet.contract.commands import CommandName


class EventType(StrEnum):
    """Every event type (the last token of `...evt.<type>`), and the in-gateway ones."""

    ARMED = "armed"
    DISARMED = "disarmed"
    MODE_CHANGED = "mode_changed"
    TAKEOFF = "takeoff"
    LANDED = "landed"
    FAILSAFE = "failsafe"
    STATUSTEXT = "statustext"
    MISSION_ITEM_REACHED = "mission_item_reached"
    MISSION_UPLOADED = "mission_uploaded"
    GEOFENCE_BREACH = "geofence_breach"
    LINK_LOST = "link_lost"
    LINK_RESTORED = "link_restored"
    GPS_FIX_CHANGED = "gps_fix_changed"
    HOME_SET = "home_set"
    CMD_RESULT = "cmd_result"
    SHADOW_CONVERGED = "shadow_converged"
    SHADOW_FAILED = "shadow_failed"
    GATEWAY_STARTED = "gateway_started"
    GATEWAY_STOPPED = "gateway_stopped"
    OWNER_ACQUIRED = "owner_acquired"  # this gateway became the vehicle's owner (lease created or taken over)
    OWNER_RELEASED = "owner_released"  # the owner stepped down cleanly (a stop, a handover)
    EVENTS_SUPPRESSED = "events_suppressed"
    LOG_DOWNLOAD_STARTED = "log_download_started"
    LOG_DOWNLOAD_PROGRESS = "log_download_progress"
    LOG_DOWNLOADED = "log_downloaded"
    LOG_DOWNLOAD_FAILED = "log_download_failed"
    PARAM_VALUE = "param_value"  # internal: a PARAM_VALUE heard, for the shadow
    # `mavjet rollout` (docs/rollout.md): fleet-level ones on fleet.<env>.rollout.<id>.evt.<type>,
    # ROLLOUT_VEHICLE on the vehicle's own event subject. Published by the operator tool, not a gateway.
    ROLLOUT_STARTED = "rollout_started"
    ROLLOUT_WAVE = "rollout_wave"  # a wave ended (every vehicle in it converged or failed)
    ROLLOUT_HALTED = "rollout_halted"  # failures exceeded the threshold
    ROLLOUT_ABORTED = "rollout_aborted"
    ROLLOUT_DONE = "rollout_done"
    ROLLOUT_ROLLED_BACK = "rollout_rolled_back"
    ROLLOUT_VEHICLE = "rollout_vehicle"  # one vehicle's outcome in a rollout


class SpoolClass(StrEnum):
    """What an event is worth when the spool is over its bound (the `class` label of the drop metric)."""

    INFO = "info"
    SAFETY = "safety"
    CMD_RESULT = "cmd_result"


class FlightEdge(StrEnum):
    """Where an event sits in a flight as analytics splits them: a flight runs from START to END."""

    START = "start"
    END = "end"


@dataclass(frozen=True, slots=True)
class Confirms:
    """`command`'s effect shows up as this event within `window_s` of the command being sent."""

    command: CommandName
    window_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class EventSpec:
    type: EventType
    fields: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    spool: SpoolClass = SpoolClass.INFO
    budget_exempt: bool = False
    confirms: tuple[Confirms, ...] = ()
    flight: FlightEdge | None = None
    internal: bool = False
    more: bool = False  # may carry further keys (a cmd_result: its command's own, docs/commands.md)


# Every event's `data` carries these where known (docs/events.md), whatever its type.
SNAPSHOT_FIELDS = ("mode", "armed", "lat_deg", "lon_deg", "alt_m", "alt_msl_m", "battery_pct", "flavour")

_E = EventType
_C = CommandName
_SAFETY = SpoolClass.SAFETY
# A landing can take many minutes after rtl/land; a mode change or arming
# follows within a second or two on a healthy link.
_QUICK_S = 15.0
_LANDING_S = 1800.0

# link_restored and geofence_breach sit with the safety events they answer or
# belong with: an audit trail holding a `link_lost` without its `link_restored`
# shows a vehicle lost for good. Never held back by the budget: `cmd_result`
# (every command ends in exactly one result), `events_suppressed` itself, and
# the gateway's own start and stop.
_SPECS = (
    EventSpec(type=_E.ARMED, spool=_SAFETY, confirms=(Confirms(_C.ARM, _QUICK_S),), flight=FlightEdge.START),
    EventSpec(type=_E.DISARMED, fields=("max_alt_m", "distance_m", "battery_used_pct", "flight_s"), spool=_SAFETY,
              confirms=(Confirms(_C.DISARM, _QUICK_S),), flight=FlightEdge.END),
    EventSpec(type=_E.MODE_CHANGED, fields=("previous_mode", "custom_mode"),
              confirms=(Confirms(_C.SET_MODE, _QUICK_S), Confirms(_C.MISSION_START, _QUICK_S))),
    EventSpec(type=_E.TAKEOFF, confirms=(Confirms(_C.TAKEOFF, 60.0),)),
    EventSpec(type=_E.LANDED, fields=("max_alt_m", "distance_m", "flight_s"),
              confirms=(Confirms(_C.LAND, _LANDING_S), Confirms(_C.RTL, _LANDING_S))),
    EventSpec(type=_E.FAILSAFE, fields=("failsafe_type", "action_taken", "system_status"), spool=_SAFETY),
    EventSpec(type=_E.STATUSTEXT, fields=("severity", "severity_name", "text", "count"), optional=("window_s",)),
    EventSpec(type=_E.MISSION_ITEM_REACHED, fields=("seq",)),
    EventSpec(type=_E.MISSION_UPLOADED, fields=("object", "digest", "count"),
              optional=("fence_digest", "fence_count", "rally_digest", "rally_count", "fence_enabled")),
    EventSpec(type=_E.GEOFENCE_BREACH, fields=("breach_type", "breach_count"), spool=_SAFETY),
    EventSpec(type=_E.LINK_LOST, fields=("heartbeat_age_s",), spool=_SAFETY),
    EventSpec(type=_E.LINK_RESTORED, fields=("outage_s",), spool=_SAFETY),
    EventSpec(type=_E.GPS_FIX_CHANGED, fields=("fix_type", "previous_fix_type", "satellites")),
    EventSpec(type=_E.HOME_SET, fields=("home_lat_deg", "home_lon_deg", "home_alt_msl_m")),
    EventSpec(type=_E.CMD_RESULT,
              fields=("cmd_id", "name", "result", "mav_result", "detail", "attempts", "latency_ms"),
              optional=("deliveries",), spool=SpoolClass.CMD_RESULT, budget_exempt=True, more=True),
    EventSpec(type=_E.SHADOW_CONVERGED, fields=("desired_revision", "duration_s")),
    EventSpec(type=_E.SHADOW_FAILED, fields=("desired_revision", "field", "reason")),
    EventSpec(type=_E.GATEWAY_STARTED, fields=("gateway", "version"), budget_exempt=True),
    EventSpec(type=_E.GATEWAY_STOPPED, fields=("gateway", "reason"), budget_exempt=True),
    # Both parties and the fencing token (docs/ownership.md); `previous` is the stale owner of a takeover.
    EventSpec(type=_E.OWNER_ACQUIRED, fields=("gateway", "holder", "previous", "token", "takeover"), spool=_SAFETY,
              budget_exempt=True),
    EventSpec(type=_E.OWNER_RELEASED, fields=("gateway", "holder", "token", "reason"), spool=_SAFETY,
              budget_exempt=True),
    EventSpec(type=_E.EVENTS_SUPPRESSED, fields=("event_type", "count", "window_s"), spool=_SAFETY,
              budget_exempt=True),
    EventSpec(type=_E.LOG_DOWNLOAD_STARTED, fields=("log_id", "total", "time_utc_s", "object")),
    EventSpec(type=_E.LOG_DOWNLOAD_PROGRESS, fields=("log_id", "bytes", "total"), optional=("paused",)),
    EventSpec(type=_E.LOG_DOWNLOADED,
              fields=("log_id", "object", "content", "size_bytes", "sha256", "kib_s", "elapsed_s", "interruptions")),
    EventSpec(type=_E.LOG_DOWNLOAD_FAILED, fields=("log_id", "bytes", "reason")),
    EventSpec(type=_E.PARAM_VALUE, fields=("name", "value", "param_type"), internal=True),
    EventSpec(type=_E.ROLLOUT_STARTED, fields=("rollout", "change", "targets", "waves", "max_failures", "selector")),
    EventSpec(type=_E.ROLLOUT_WAVE, fields=("rollout", "wave", "waves", "vehicles", "converged", "failed")),
    EventSpec(type=_E.ROLLOUT_HALTED, fields=("rollout", "wave", "failed", "reason")),
    EventSpec(type=_E.ROLLOUT_ABORTED, fields=("rollout", "wave", "reason")),
    EventSpec(type=_E.ROLLOUT_DONE, fields=("rollout", "converged", "failed", "duration_s")),
    EventSpec(type=_E.ROLLOUT_ROLLED_BACK, fields=("rollout", "restored", "kept")),
    EventSpec(type=_E.ROLLOUT_VEHICLE, fields=("rollout", "wave", "result", "failure", "detail", "desired_revision")),
)

#: The catalogue, by type, in EventType's order.
EVENTS: Mapping[EventType, EventSpec] = MappingProxyType({s.type: s for s in _SPECS})

#: Types published to TWIN_EVENTS (the internal ones never are).
PUBLISHED: frozenset[EventType] = frozenset(t for t, s in EVENTS.items() if not s.internal)

#: The spool's priority of each type that is not INFO.
SPOOL_CLASS: Mapping[str, SpoolClass] = MappingProxyType(
    {t: s.spool for t, s in EVENTS.items() if s.spool is not SpoolClass.INFO}
)

#: Types the per-vehicle event budget never holds back.
BUDGET_EXEMPT: frozenset[EventType] = frozenset(t for t, s in EVENTS.items() if s.budget_exempt)

#: Command -> (the event its effect shows up as, how long after the command that event still counts).
EFFECTS: Mapping[CommandName, tuple[EventType, float]] = MappingProxyType(
    {c.command: (t, c.window_s) for t, s in EVENTS.items() for c in s.confirms}
)


def flight_edge(edge: FlightEdge) -> EventType:
    """The one event type at `edge` of a flight (analytics splits a vehicle's events into flights by them)."""
    (found,) = (t for t, s in EVENTS.items() if s.flight is edge)
    return found


def spec(event_type: str) -> EventSpec:
    """The catalogue entry of `event_type`; KeyError for a type the catalogue does not know."""
    try:
        return EVENTS[EventType(event_type)]
    except ValueError:
        known = ", ".join(t.value for t in EventType)
        raise KeyError(f"unknown event type {event_type!r} (known: {known})") from None
