"""A flight recorder sample on TWIN_TRACKS: its `data` map, payload and `Nats-Msg-Id` (docs/design.md, Tracks).

Shared by whatever writes tracks: the gateway's recorder (gateway/stores/recorder.py)
and the synthetic history (`mavjet synth`, analytics/synth.py), so a reader
(analytics/tracks.py) cannot tell the two apart. Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mavjet.contract import envelope


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
