"""Crafting messages "from the vehicle": packed and parsed, so headers are real."""

from __future__ import annotations

from typing import Any

from mavjet.drivers.mavlink.dialect import mavlink2

VEHICLE_SYS = 1
VEHICLE_COMP = 1
GCS_SYS = 245
GCS_COMP = 191


def wire(msg: Any, sysid: int = VEHICLE_SYS, compid: int = VEHICLE_COMP) -> Any:
    """`msg` as a receiver sees it after a real encode/decode round trip."""
    tx = mavlink2.MAVLink(None, srcSystem=sysid, srcComponent=compid)
    rx = mavlink2.MAVLink(None, srcSystem=GCS_SYS, srcComponent=GCS_COMP)
    out = rx.parse_buffer(msg.pack(tx))
    assert out and len(out) == 1, out
    return out[0]


def ack(command: int, result: int, progress: int = 0, *, target_system: int = 0, sysid: int = VEHICLE_SYS) -> Any:
    return wire(
        mavlink2.MAVLink_command_ack_message(command, result, progress, 0, target_system, 0), sysid=sysid
    )


def heartbeat(armed: bool, sysid: int = VEHICLE_SYS, compid: int = VEHICLE_COMP) -> Any:
    base = mavlink2.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED | (mavlink2.MAV_MODE_FLAG_SAFETY_ARMED if armed else 0)
    return wire(
        mavlink2.MAVLink_heartbeat_message(
            mavlink2.MAV_TYPE_QUADROTOR, mavlink2.MAV_AUTOPILOT_ARDUPILOTMEGA, base, 4, 4, 3
        ),
        sysid=sysid,
        compid=compid,
    )
