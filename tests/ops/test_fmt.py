"""Operator CLI formatting: units from field names, enum names, no reprs."""

from __future__ import annotations

import pytest

from mavjet.ops.fmt import format_fields, format_value


@pytest.mark.parametrize(
    ("field", "value", "shown"),
    [
        ("lat_deg", -35.3632621, "-35.3632621"),
        ("lon_deg", 149.16523, "149.1652300"),
        ("alt_m", 12.3456, "12.3"),
        ("groundspeed_m_s", 4.26, "4.3"),
        ("voltage_v", 12.345, "12.35"),
        ("remaining_pct", 87.6, "88"),
        ("system_status", 3, "STANDBY"),
        ("landed_state", 2, "IN_AIR"),
        ("fix_type", 3, "3D_FIX"),
        ("fix_type", 250, "250"),
        ("armed", True, "yes"),
        ("home", {"lat_deg": 1.5, "alt_msl_m": 584.0}, "(lat_deg=1.5000000, alt_msl_m=584.0)"),
        ("modes", ["A", "B"], "[A, B]"),
        ("mode", None, "-"),
    ],
)
def test_values_are_shown_with_their_units_and_names(field: str, value: object, shown: str) -> None:
    assert format_value(field, value) == shown


def test_fields_skip_missing_values() -> None:
    assert format_fields({"mode": "GUIDED", "custom_mode": None, "landed_state": 1}) == "mode=GUIDED, landed_state=ON_GROUND"
