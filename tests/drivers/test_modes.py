from __future__ import annotations

import pytest

from mavjet.drivers.mavlink.autopilot import is_autopilot_heartbeat
from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.drivers.mavlink.modes import (
    Flavour,
    UnknownMode,
    VehicleClass,
    table_for,
)


def test_arducopter_table() -> None:
    t = table_for(mavlink2.MAV_AUTOPILOT_ARDUPILOTMEGA, mavlink2.MAV_TYPE_QUADROTOR)
    assert t.flavour is Flavour.ARDUPILOT and t.vehicle_class is VehicleClass.COPTER
    assert t.name(4) == "GUIDED" and t.name(6) == "RTL" and t.name(9) == "LAND"
    assert t.custom_mode("guided") == 4
    assert t.is_recovery("RTL") and not t.is_recovery("GUIDED")
    assert t.name(99) == "MODE_99"


def test_arduplane_and_rover_tables_differ() -> None:
    plane = table_for(mavlink2.MAV_AUTOPILOT_ARDUPILOTMEGA, mavlink2.MAV_TYPE_FIXED_WING)
    rover = table_for(mavlink2.MAV_AUTOPILOT_ARDUPILOTMEGA, mavlink2.MAV_TYPE_GROUND_ROVER)
    assert plane.name(11) == "RTL" and plane.custom_mode("FBWA") == 5
    assert rover.name(4) == "HOLD" and rover.custom_mode("GUIDED") == 15


def test_px4_main_and_sub_modes() -> None:
    t = table_for(mavlink2.MAV_AUTOPILOT_PX4, mavlink2.MAV_TYPE_QUADROTOR)
    assert t.custom_mode("POSCTL") == 3 << 16
    mission = t.custom_mode("AUTO.MISSION")
    assert mission == (4 << 24) | (4 << 16)
    assert t.name(mission) == "AUTO.MISSION"
    assert t.name((5 << 24) | (4 << 16)) == "AUTO.RTL"
    assert t.is_recovery("AUTO.RTL")


def test_unknown_mode_lists_known() -> None:
    t = table_for(mavlink2.MAV_AUTOPILOT_ARDUPILOTMEGA, mavlink2.MAV_TYPE_QUADROTOR)
    with pytest.raises(UnknownMode) as ei:
        t.custom_mode("WARP")
    assert "GUIDED" in ei.value.known


def test_gcs_heartbeats_are_not_autopilots() -> None:
    assert not is_autopilot_heartbeat(mavlink2.MAV_TYPE_GCS, mavlink2.MAV_AUTOPILOT_INVALID)
    assert is_autopilot_heartbeat(mavlink2.MAV_TYPE_QUADROTOR, mavlink2.MAV_AUTOPILOT_PX4)
