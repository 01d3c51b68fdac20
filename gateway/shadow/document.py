"""The desired document: schema and validation with a reason per field. Pure.

Operators edit `desired` with ordinary tools, so a document may be anything:
not JSON, a list, a misspelled field, a string where a number belongs. The
parser never raises; it returns what it could understand plus
`errors: {path: reason}`. A bad field is reported in `reported.delta` and
left alone; the good fields beside it are still reconciled, and a bad
document for one vehicle never stops the gateway serving the others.

Checks that need the vehicle (does this param exist, what is its type, is
this a mode the autopilot knows) are the `check_*` functions, fed with what
was read from the vehicle.

Fields (any may be absent: absent = no opinion):

- `mode` (str), `armed` (bool) — flight state, applied once per revision.
- `params` {NAME: number}, `mission` {object, digest}, `geofence`
  {polygons, circles, max_alt_m, action}, `rates` {channel: hz} —
  configuration, level-triggered. The geofence schema and its conversion
  to FENCE items and parameters are mavjet.drivers.mavlink.fence's.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mavjet.drivers.mavlink.fence import Geofence, GeofenceError, geofence_from_dict
from mavjet.drivers.mavlink.params import INT_TYPES, PARAM_ID_MAX_LEN

FLIGHT_FIELDS = ("mode", "armed")
CONFIG_FIELDS = ("params", "mission", "geofence", "rates")
FIELDS = FLIGHT_FIELDS + CONFIG_FIELDS
MAX_DOC_BYTES = 1024 * 1024  # the bucket's max value size

# Stream-rate channels → the MAVLink message whose interval they set. Upper-case
# MAVLink message names are accepted as well (see `fence.rate_message_id`).
RATE_CHANNELS: dict[str, str] = {
    "position": "GLOBAL_POSITION_INT",
    "attitude": "ATTITUDE",
    "battery": "BATTERY_STATUS",
    "gps": "GPS_RAW_INT",
    "status": "SYS_STATUS",
    "hud": "VFR_HUD",
    "extended_status": "EXTENDED_SYS_STATE",
    "system_time": "SYSTEM_TIME",
}
# Below 0.5 Hz the link's stale-stream check (5 s) would ask for the stream
# again at its own rate and the two would fight; 0 (off) would starve the twin.
MIN_RATE_HZ = 0.5
MAX_RATE_HZ = 50.0

_PARAM_RE = re.compile(r"^[A-Z0-9_]+$")
_DIGEST_RE = re.compile(r"^[0-9a-f]{12,64}$")
_INT_RANGES: dict[int, tuple[int, int]] = {
    t: ((-(2 ** (8 * struct.calcsize(fmt) - 1)), 2 ** (8 * struct.calcsize(fmt) - 1) - 1) if fmt[1].islower()
        else (0, 2 ** (8 * struct.calcsize(fmt)) - 1))
    for t, fmt in INT_TYPES.items()
}


@dataclass(frozen=True, slots=True, kw_only=True)
class MissionSpec:
    object: str  # name in TWIN_BLOBS, e.g. missions/survey.plan
    digest: str  # mavjet.drivers.mavlink.plan.digest of its mission items (hex, >= 12 chars)

    def matches(self, digest: str) -> bool:
        return digest.startswith(self.digest)


@dataclass(frozen=True, slots=True, kw_only=True)
class Desired:
    """A parsed desired document at one KV revision."""

    revision: int
    mode: str | None = None
    armed: bool | None = None
    params: Mapping[str, float] = field(default_factory=dict)
    mission: MissionSpec | None = None
    geofence: Geofence | None = None
    rates: Mapping[str, float] = field(default_factory=dict)
    errors: Mapping[str, str] = field(default_factory=dict)  # path -> reason
    raw: Mapping[str, Any] = field(default_factory=dict)  # the document as written (valid JSON object only)

    def mentions(self, name: str) -> bool:
        return name in self.raw

    @property
    def valid_fields(self) -> tuple[str, ...]:
        out = []
        for f in FIELDS:
            if f not in self.raw or f in self.errors:
                continue
            out.append(f)
        return tuple(out)


EMPTY = Desired(revision=0)


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    v = float(value)
    return v if math.isfinite(v) else None


def _lat_lon(pt: Any, path: str, errors: dict[str, str]) -> tuple[float, float] | None:
    if not isinstance(pt, list | tuple) or len(pt) < 2:
        errors[path] = "expected [lat_deg, lon_deg]"
        return None
    lat, lon = _finite(pt[0]), _finite(pt[1])
    if lat is None or lon is None:
        errors[path] = "latitude and longitude must be finite numbers"
        return None
    if not -90 <= lat <= 90:
        errors[path] = f"latitude {lat} outside [-90, 90]"
        return None
    if not -180 <= lon <= 180:
        errors[path] = f"longitude {lon} outside [-180, 180]"
        return None
    return lat, lon


def _parse_params(raw: Any, errors: dict[str, str]) -> dict[str, float]:
    if not isinstance(raw, Mapping):
        errors["params"] = f"expected an object {{NAME: number}}, got {type(raw).__name__}"
        return {}
    out: dict[str, float] = {}
    for name, value in raw.items():
        path = f"params.{name}"
        if not isinstance(name, str) or not _PARAM_RE.match(name) or len(name) > PARAM_ID_MAX_LEN:
            errors[path] = f"not a parameter name (A-Z, 0-9, _; at most {PARAM_ID_MAX_LEN} characters)"
            continue
        v = _finite(value)
        if v is None:
            errors[path] = f"expected a finite number, got {value!r}"
            continue
        out[name] = v
    return out


def _parse_mission(raw: Any, errors: dict[str, str]) -> MissionSpec | None:
    if not isinstance(raw, Mapping):
        errors["mission"] = "expected {\"object\": name, \"digest\": hex}"
        return None
    unknown = sorted(set(raw) - {"object", "digest"})
    if unknown:
        errors["mission"] = f"unknown keys {unknown} (allowed: object, digest)"
        return None
    obj, dig = raw.get("object"), raw.get("digest")
    if not isinstance(obj, str) or not obj.strip():
        errors["mission"] = "mission.object must name an object in TWIN_BLOBS (e.g. missions/survey.plan)"
        return None
    if not isinstance(dig, str) or not _DIGEST_RE.match(dig.lower()):
        errors["mission"] = "mission.digest must be the mission's sha256 digest in hex (at least 12 characters)"
        return None
    return MissionSpec(object=obj.strip(), digest=dig.lower())


def _parse_geofence(raw: Any, errors: dict[str, str]) -> Geofence | None:
    try:
        return geofence_from_dict(raw)
    except GeofenceError as exc:
        errors[exc.path] = exc.reason
        return None


def _parse_rates(raw: Any, errors: dict[str, str]) -> dict[str, float]:
    if not isinstance(raw, Mapping):
        errors["rates"] = "expected an object {channel: hz}"
        return {}
    out: dict[str, float] = {}
    for ch, hz in raw.items():
        path = f"rates.{ch}"
        if not isinstance(ch, str) or (ch not in RATE_CHANNELS and not _PARAM_RE.match(ch)):
            errors[path] = f"unknown channel (known: {', '.join(RATE_CHANNELS)}, or a MAVLink message name)"
            continue
        v = _finite(hz)
        if v is None or not MIN_RATE_HZ <= v <= MAX_RATE_HZ:
            errors[path] = f"rate must be a number in [{MIN_RATE_HZ}, {MAX_RATE_HZ}] Hz, got {hz!r}"
            continue
        out[ch] = v
    return out


def parse_desired(data: bytes | str | None, revision: int) -> Desired:
    """Parse a desired document; never raises. `data=None` (deleted key) is an empty opinion."""
    if data is None or (isinstance(data, bytes | str) and not data.strip()):
        return Desired(revision=revision)
    if len(data) > MAX_DOC_BYTES:
        return Desired(revision=revision, errors={"$": f"document larger than {MAX_DOC_BYTES} bytes"})
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        return Desired(revision=revision, errors={"$": f"not valid JSON: {exc}"})
    if not isinstance(doc, dict):
        return Desired(revision=revision, errors={"$": f"expected a JSON object, got {type(doc).__name__}"})
    errors: dict[str, str] = {}
    for k in doc:
        if k not in FIELDS:
            errors[k] = f"unknown field (known: {', '.join(FIELDS)})"
    mode: str | None = None
    if "mode" in doc:
        if isinstance(doc["mode"], str) and doc["mode"].strip():
            mode = doc["mode"].strip().upper()
        else:
            errors["mode"] = f"expected a mode name, got {doc['mode']!r}"
    armed: bool | None = None
    if "armed" in doc:
        if isinstance(doc["armed"], bool):
            armed = doc["armed"]
        else:
            errors["armed"] = f"expected true or false, got {doc['armed']!r}"
    params = _parse_params(doc["params"], errors) if "params" in doc else {}
    mission = _parse_mission(doc["mission"], errors) if "mission" in doc else None
    geofence = _parse_geofence(doc["geofence"], errors) if "geofence" in doc else None
    rates = _parse_rates(doc["rates"], errors) if "rates" in doc else {}
    return Desired(
        revision=revision, mode=mode, armed=armed, params=params, mission=mission, geofence=geofence,
        rates=rates, errors=errors, raw=doc,
    )


# -- checks against what the vehicle says ----------------------------------------


def check_param(name: str, value: float, param_type: int | None) -> str | None:
    """Why `value` cannot be stored in `name` (None when it can). `param_type=None`: unknown param."""
    if param_type is None:
        return "unknown parameter: the vehicle did not answer PARAM_REQUEST_READ for it"
    rng = _INT_RANGES.get(param_type)
    if rng is not None:
        if not float(value).is_integer():
            return f"{value} is not an integer; {name} is an integer parameter"
        if not rng[0] <= value <= rng[1]:
            return f"{value:g} is out of range [{rng[0]}, {rng[1]}] for {name}'s type"
    elif abs(value) > 3.4e38:
        return f"{value:g} does not fit a float32 parameter"
    return None


def check_mode(mode: str, known: list[str]) -> str | None:
    """Why `mode` cannot be set on this vehicle (None when it can)."""
    if not known:
        return "the vehicle's mode table is not known yet (no HEARTBEAT)"
    if mode not in known:
        return f"unknown mode {mode!r} for this vehicle (known: {', '.join(known)})"
    return None
