"""The autopilot rules, each defined once in mavjet.drivers.mavlink.autopilot."""

from __future__ import annotations

import pytest

from mavjet.drivers.mavlink.autopilot import (
    AIRBORNE_LANDED_STATES,
    FORCE_DISARM_MAGIC,
    arm_params,
    autopilot_version_fields,
    is_airborne,
    is_autopilot_heartbeat,
    is_vehicle_heartbeat,
    set_mode_params,
)
from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.drivers.mavlink.modes import Flavour, ModeTable, UnknownMode, VehicleClass
from tests.drivers.helpers import heartbeat, wire

CUSTOM = float(mavlink2.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED)
LANDED_STATES = {e.name: value for value, e in mavlink2.enums["MAV_LANDED_STATE"].items() if not e.name.endswith("_ENUM_END")}


def test_every_landed_state_has_a_decided_airborne_value() -> None:
    want = {
        "MAV_LANDED_STATE_UNDEFINED": False,
        "MAV_LANDED_STATE_ON_GROUND": False,
        "MAV_LANDED_STATE_IN_AIR": True,
        "MAV_LANDED_STATE_TAKEOFF": True,
        "MAV_LANDED_STATE_LANDING": True,  # still flying until it touches down
    }
    assert set(LANDED_STATES) == set(want), "a new MAV_LANDED_STATE: decide whether it is airborne"
    for name, value in LANDED_STATES.items():
        assert is_airborne(value) is want[name], name
    assert is_airborne(None) is False  # not known yet: not airborne
    assert {LANDED_STATES[n] for n, air in want.items() if air} == AIRBORNE_LANDED_STATES


@pytest.mark.parametrize(
    ("flavour", "vclass", "mode", "params"),
    [
        (Flavour.ARDUPILOT, VehicleClass.COPTER, "GUIDED", (CUSTOM, 4.0)),
        (Flavour.ARDUPILOT, VehicleClass.COPTER, "rtl", (CUSTOM, 6.0)),
        (Flavour.ARDUPILOT, VehicleClass.PLANE, "GUIDED", (CUSTOM, 15.0)),
        (Flavour.ARDUPILOT, VehicleClass.ROVER, "HOLD", (CUSTOM, 4.0)),
        (Flavour.PX4, VehicleClass.COPTER, "POSCTL", (CUSTOM, 3.0, 0.0)),
        (Flavour.PX4, VehicleClass.COPTER, "OFFBOARD", (CUSTOM, 6.0, 0.0)),
        (Flavour.PX4, VehicleClass.COPTER, "AUTO.MISSION", (CUSTOM, 4.0, 4.0)),
        (Flavour.PX4, VehicleClass.COPTER, "AUTO.RTL", (CUSTOM, 4.0, 5.0)),
        (Flavour.PX4, VehicleClass.PLANE, "AUTO.LAND", (CUSTOM, 4.0, 6.0)),
    ],
)
def test_set_mode_params(flavour: Flavour, vclass: VehicleClass, mode: str, params: tuple[float, ...]) -> None:
    table = ModeTable(flavour=flavour, vehicle_class=vclass)
    assert set_mode_params(table, mode) == params


def test_px4_set_mode_params_unpack_what_heartbeat_packs() -> None:
    table = ModeTable(flavour=Flavour.PX4, vehicle_class=VehicleClass.COPTER)
    for name in table.names():
        _, main, *sub = set_mode_params(table, name)
        packed = (int(main) << 16) | ((int(sub[0]) if sub else 0) << 24)
        assert table.name(packed) == name


def test_set_mode_params_unknown_mode() -> None:
    with pytest.raises(UnknownMode, match="this vehicle knows"):
        set_mode_params(ModeTable(flavour=Flavour.ARDUPILOT, vehicle_class=VehicleClass.COPTER), "POSCTL")
    with pytest.raises(UnknownMode, match="not known"):
        set_mode_params(ModeTable(flavour=Flavour.GENERIC, vehicle_class=VehicleClass.COPTER), "GUIDED")


def test_arm_params() -> None:
    assert arm_params(True) == (1.0, 0.0)
    assert arm_params(False) == (0.0, 0.0)
    assert arm_params(False, force=True) == (0.0, FORCE_DISARM_MAGIC)


def test_which_heartbeat_is_the_autopilots() -> None:
    assert is_autopilot_heartbeat(mavlink2.MAV_TYPE_QUADROTOR, mavlink2.MAV_AUTOPILOT_ARDUPILOTMEGA)
    assert not is_autopilot_heartbeat(mavlink2.MAV_TYPE_GCS, mavlink2.MAV_AUTOPILOT_INVALID)
    assert not is_autopilot_heartbeat(mavlink2.MAV_TYPE_GIMBAL, mavlink2.MAV_AUTOPILOT_ARDUPILOTMEGA)
    assert not is_autopilot_heartbeat(mavlink2.MAV_TYPE_QUADROTOR, mavlink2.MAV_AUTOPILOT_INVALID)
    assert is_vehicle_heartbeat(heartbeat(False), 1, 1)
    assert not is_vehicle_heartbeat(heartbeat(False, sysid=2), 1, 1)  # another vehicle
    assert not is_vehicle_heartbeat(heartbeat(False, compid=154), 1, 1)  # another component
    gcs = wire(mavlink2.MAVLink_heartbeat_message(mavlink2.MAV_TYPE_GCS, mavlink2.MAV_AUTOPILOT_INVALID, 0, 0, 0, 3))
    assert not is_vehicle_heartbeat(gcs, 1, 1)
    ack = wire(mavlink2.MAVLink_command_ack_message(400, 0, 0, 0, 0, 0))
    assert not is_vehicle_heartbeat(ack, 1, 1)


def test_autopilot_version_fields() -> None:
    msg = wire(
        mavlink2.MAVLink_autopilot_version_message(
            0, (4 << 24) | (5 << 16) | (1 << 8) | 255, 0, 0, 0, b"\0" * 8, b"\0" * 8, b"\0" * 8, 0x1209, 0x5740,
            0x0123456789ABCDEF, uid2=list(b"SN-42".ljust(18, b"\0")),
        )
    )
    fields = autopilot_version_fields(msg)
    assert fields["firmware"] == "4.5.1" and fields["firmware_type"] == "official"
    assert fields["uid"] == "0123456789abcdef" and fields["serial"] == "SN-42"
    assert fields["vendor_id"] == 0x1209 and fields["product_id"] == 0x5740
