"""Autopilot rules, each defined once. Pure functions over MAVLink values.

Every part of the gateway that asks "is the vehicle in the air?", "which
HEARTBEAT is the autopilot's?", "how do I ask this autopilot for mode X?" or
"what firmware is this?" asks here, so telemetry, commands and the shadow
cannot disagree. The facts that are pure functions of MAVLink numbers (armed,
airborne, in a failsafe) are `mavjet.contract.vehicle`'s, re-exported here:
analytics, which may import only the contract, decodes them the same way.
"""

from __future__ import annotations

from typing import Any

from mavjet.contract.vehicle import AIRBORNE_LANDED_STATES, is_airborne, is_armed, is_failsafe_state
from mavjet.drivers.mavlink.dialect import MavMessage, mavlink2
from mavjet.drivers.mavlink.modes import Flavour, ModeTable, px4_unpack

__all__ = [
    "AIRBORNE_LANDED_STATES",
    "FORCE_DISARM_MAGIC",
    "arm_params",
    "autopilot_version_fields",
    "command_altitude",
    "heartbeat_armed",
    "is_airborne",
    "is_armed",
    "is_autopilot_heartbeat",
    "is_failsafe_state",
    "is_vehicle_heartbeat",
    "set_mode_params",
]

#: MAV_CMD_COMPONENT_ARM_DISARM param2 that disarms even in flight (both ArduPilot and PX4).
FORCE_DISARM_MAGIC = 21196.0

# HEARTBEATs of these types come from a ground station or a peripheral, never a flight controller.
_NOT_AUTOPILOT_TYPES = frozenset({
    mavlink2.MAV_TYPE_GCS, mavlink2.MAV_TYPE_ONBOARD_CONTROLLER, mavlink2.MAV_TYPE_GIMBAL,
    mavlink2.MAV_TYPE_CAMERA, mavlink2.MAV_TYPE_ADSB, mavlink2.MAV_TYPE_ANTENNA_TRACKER,
})
_INVALID = mavlink2.MAV_AUTOPILOT_INVALID
_CUSTOM_MODE_ENABLED = float(mavlink2.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED)


def is_autopilot_heartbeat(mav_type: int, autopilot: int) -> bool:
    """True for a vehicle's flight controller, false for GCSs, gimbals, cameras..."""
    return autopilot != _INVALID and mav_type not in _NOT_AUTOPILOT_TYPES


def is_vehicle_heartbeat(msg: MavMessage, target_system: int, target_component: int) -> bool:
    """True for a HEARTBEAT sent by the flight controller at (target_system, target_component)."""
    return bool(
        msg.get_type() == "HEARTBEAT"
        and msg.get_srcSystem() == target_system
        and msg.get_srcComponent() == target_component
        and is_autopilot_heartbeat(msg.type, msg.autopilot)
    )


def heartbeat_armed(msg: MavMessage) -> bool:
    """The armed bit of a HEARTBEAT message (`is_armed` of its base_mode)."""
    return is_armed(int(msg.base_mode))


def set_mode_params(modes: ModeTable, name: str) -> tuple[float, ...]:
    """MAV_CMD_DO_SET_MODE params for mode `name`; raises modes.UnknownMode.

    param1 is always MAV_MODE_FLAG_CUSTOM_MODE_ENABLED. ArduPilot takes its
    mode number as param2. PX4 packs main mode (bits 16-23) and sub mode
    (bits 24-31) into custom_mode, but DO_SET_MODE wants them unpacked: main
    mode as param2, sub mode as param3.
    """
    custom = modes.custom_mode(name)
    if modes.flavour is Flavour.PX4:
        main, sub = px4_unpack(custom)
        return (_CUSTOM_MODE_ENABLED, float(main), float(sub))
    return (_CUSTOM_MODE_ENABLED, float(custom))


def arm_params(armed: bool, *, force: bool = False) -> tuple[float, float]:
    """MAV_CMD_COMPONENT_ARM_DISARM params. `force` only for a disarm (it would bypass pre-arm checks on arm)."""
    if armed:
        return (1.0, 0.0)
    return (0.0, FORCE_DISARM_MAGIC if force else 0.0)


def command_altitude(flavour: str | None, alt_m: float, home_amsl_m: float | None) -> tuple[float, int] | None:
    """The altitude param (param7 / COMMAND_INT z) and frame of a NAV_TAKEOFF or DO_REPOSITION for a target
    `alt_m` above home, or None when the flavour needs home and it is not known.

    ArduPilot reads them in the command's frame: a height above home in MAV_FRAME_GLOBAL_RELATIVE_ALT(_INT)
    (COMMAND_LONG's NAV_TAKEOFF is relative too). PX4 reads param7 as an altitude above mean sea level and
    ignores the frame (navigator: `_takeoff.setLoiterAltitudeAmsl(param7)`, reposition `alt = param7`), so it
    gets home AMSL + `alt_m` in MAV_FRAME_GLOBAL(_INT): a relative 10 m there is below the ground and the
    takeoff ends "Already higher than takeoff altitude" (docs/sim.md, PX4 fidelity).
    """
    if flavour == Flavour.PX4:
        if home_amsl_m is None:
            return None
        return home_amsl_m + alt_m, mavlink2.MAV_FRAME_GLOBAL_INT
    return alt_m, mavlink2.MAV_FRAME_GLOBAL_RELATIVE_ALT_INT


_FIRMWARE_TYPES = {0: "dev", 64: "alpha", 128: "beta", 192: "rc", 255: "official"}


def autopilot_version_fields(msg: MavMessage) -> dict[str, Any]:
    """Identity from AUTOPILOT_VERSION: firmware version, serial (uid/uid2), board ids."""
    sw = int(msg.flight_sw_version)
    uid2 = bytes(int(b) & 0xFF for b in getattr(msg, "uid2", []) or [])
    uid2_text = uid2.rstrip(b"\0").decode("ascii", "replace") if any(uid2) else ""
    out: dict[str, Any] = {
        "firmware": f"{(sw >> 24) & 0xFF}.{(sw >> 16) & 0xFF}.{(sw >> 8) & 0xFF}",
        "firmware_type": _FIRMWARE_TYPES.get(sw & 0xFF, str(sw & 0xFF)),
        "uid": f"{int(msg.uid):016x}",
        "serial": uid2_text if uid2_text.isprintable() and uid2_text else f"{int(msg.uid):016x}",
        "board_version": int(msg.board_version),
        "vendor_id": int(msg.vendor_id),
        "product_id": int(msg.product_id),
        "capabilities": int(msg.capabilities),
    }
    return out
