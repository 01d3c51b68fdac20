"""How the operator CLI shows a value: units from the field's name, enum names, no reprs.

Field names carry their units (`alt_m`, `groundspeed_m_s`, `lat_deg`), so the
format follows the name: latitudes and longitudes (`lat_deg`,
`home_lon_deg`...) to 7 decimals (1 cm; 6 significant digits would be ~100 m
off, and 0.1 as for other degrees ~10 km), metres and speeds to 0.1, volts to
0.01, percentages whole. MAVLink enum numbers are shown by name
(`system_status=STANDBY`, `landed_state=IN_AIR`, `fix_type=3D_FIX`), and
nested maps and lists as `k=v` lists, never as Python reprs.
"""

from __future__ import annotations

from typing import Any

from mavjet.drivers.mavlink.dialect import mavlink2

# field name -> (MAVLink enum, prefix to drop from its entry names)
ENUM_FIELDS: dict[str, tuple[str, str]] = {
    "system_status": ("MAV_STATE", "MAV_STATE_"),
    "landed_state": ("MAV_LANDED_STATE", "MAV_LANDED_STATE_"),
    "fix_type": ("GPS_FIX_TYPE", "GPS_FIX_TYPE_"),
    "previous_fix_type": ("GPS_FIX_TYPE", "GPS_FIX_TYPE_"),
}


def enum_name(field: str, value: int) -> str:
    """`landed_state`, 2 -> `IN_AIR`; a number the dialect does not know stays a number."""
    enum, prefix = ENUM_FIELDS[field]
    entry = mavlink2.enums.get(enum, {}).get(value)
    return str(value) if entry is None else entry.name.removeprefix(prefix)


def format_value(field: str, value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if field in ENUM_FIELDS and isinstance(value, int):
        return enum_name(field, value)
    if isinstance(value, float):
        if field.endswith(("lat_deg", "lon_deg")):  # home_lat_deg too: 0.1° would be ~10 km
            return f"{value:.7f}"
        if field.endswith("_pct"):
            return f"{value:.0f}"
        if field.endswith(("_v", "_a")):
            return f"{value:.2f}"
        if field.endswith(("_m", "_m_s", "_deg", "_deg_s", "_s")):
            return f"{value:.1f}"
        return f"{value:.6g}"
    if isinstance(value, dict):
        return "(" + ", ".join(f"{k}={format_value(k, v)}" for k, v in value.items()) + ")"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(format_value(field, v) for v in value) + "]"
    return str(value)


def format_fields(data: dict[str, Any]) -> str:
    """`k=v` for every field that has a value, in the record's order."""
    return ", ".join(f"{k}={format_value(k, v)}" for k, v in data.items() if v is not None)
