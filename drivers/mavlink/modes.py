"""Autopilot flavours and their flight-mode tables. Pure data and functions.

ArduPilot puts a per-vehicle-type mode number in HEARTBEAT.custom_mode. PX4
packs a main mode in bits 16-23 and a sub mode in bits 24-31.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from mavjet.contract.errors import MavjetError
from mavjet.drivers.mavlink.dialect import mavlink2

ARDUCOPTER_MODES: dict[int, str] = {
    0: "STABILIZE", 1: "ACRO", 2: "ALT_HOLD", 3: "AUTO", 4: "GUIDED", 5: "LOITER", 6: "RTL",
    7: "CIRCLE", 9: "LAND", 11: "DRIFT", 13: "SPORT", 14: "FLIP", 15: "AUTOTUNE", 16: "POSHOLD",
    17: "BRAKE", 18: "THROW", 19: "AVOID_ADSB", 20: "GUIDED_NOGPS", 21: "SMART_RTL", 22: "FLOWHOLD",
    23: "FOLLOW", 24: "ZIGZAG", 25: "SYSTEMID", 26: "AUTOROTATE", 27: "AUTO_RTL", 28: "TURTLE",
}
ARDUPLANE_MODES: dict[int, str] = {
    0: "MANUAL", 1: "CIRCLE", 2: "STABILIZE", 3: "TRAINING", 4: "ACRO", 5: "FBWA", 6: "FBWB",
    7: "CRUISE", 8: "AUTOTUNE", 10: "AUTO", 11: "RTL", 12: "LOITER", 13: "TAKEOFF", 14: "AVOID_ADSB",
    15: "GUIDED", 17: "QSTABILIZE", 18: "QHOVER", 19: "QLOITER", 20: "QLAND", 21: "QRTL",
    22: "QAUTOTUNE", 23: "QACRO", 24: "THERMAL", 25: "LOITER_ALT_QLAND",
}
ARDUROVER_MODES: dict[int, str] = {
    0: "MANUAL", 1: "ACRO", 3: "STEERING", 4: "HOLD", 5: "LOITER", 6: "FOLLOW", 7: "SIMPLE",
    8: "DOCK", 10: "AUTO", 11: "RTL", 12: "SMART_RTL", 15: "GUIDED",
}
PX4_MAIN_MODES: dict[int, str] = {
    1: "MANUAL", 2: "ALTCTL", 3: "POSCTL", 4: "AUTO", 5: "ACRO", 6: "OFFBOARD", 7: "STABILIZED",
    8: "RATTITUDE",
}
PX4_AUTO_SUB_MODES: dict[int, str] = {
    1: "READY", 2: "TAKEOFF", 3: "LOITER", 4: "MISSION", 5: "RTL", 6: "LAND", 8: "FOLLOW_TARGET",
    9: "PRECLAND",
}

_PLANE_TYPES = {
    mavlink2.MAV_TYPE_FIXED_WING, mavlink2.MAV_TYPE_VTOL_DUOROTOR,
    mavlink2.MAV_TYPE_VTOL_QUADROTOR, mavlink2.MAV_TYPE_VTOL_TILTROTOR,
    mavlink2.MAV_TYPE_VTOL_GYRODYNE,
}
_ROVER_TYPES = {mavlink2.MAV_TYPE_GROUND_ROVER, mavlink2.MAV_TYPE_SURFACE_BOAT}

# Modes an autopilot enters on its own to protect the vehicle. A reconciler
# must never switch away from these: fighting the autopilot's own failsafe
# action could crash the vehicle it is trying to save.
RECOVERY_MODES = frozenset(
    {"RTL", "LAND", "SMART_RTL", "AUTO_RTL", "QRTL", "QLAND", "BRAKE", "AUTO.RTL", "AUTO.LAND", "AUTO.PRECLAND"}
)


class Flavour(StrEnum):
    ARDUPILOT = "ardupilot"
    PX4 = "px4"
    GENERIC = "generic"


class VehicleClass(StrEnum):
    COPTER = "copter"
    PLANE = "plane"
    ROVER = "rover"


class UnknownMode(MavjetError):
    def __init__(self, mode: str, known: list[str]) -> None:
        if known:
            super().__init__(f"unknown mode {mode!r}; this vehicle knows {', '.join(known)}")
        else:
            super().__init__(f"mode {mode!r}: the vehicle's modes are not known (no HEARTBEAT yet, or a generic autopilot)")
        self.mode = mode
        self.known = known


@dataclass(frozen=True, slots=True, kw_only=True)
class ModeTable:
    """Mode names <-> HEARTBEAT.custom_mode for one autopilot and vehicle class."""

    flavour: Flavour
    vehicle_class: VehicleClass

    def _ardupilot(self) -> dict[int, str]:
        if self.vehicle_class is VehicleClass.PLANE:
            return ARDUPLANE_MODES
        if self.vehicle_class is VehicleClass.ROVER:
            return ARDUROVER_MODES
        return ARDUCOPTER_MODES

    def name(self, custom_mode: int) -> str:
        if self.flavour is Flavour.PX4:
            main = (custom_mode >> 16) & 0xFF
            sub = (custom_mode >> 24) & 0xFF
            main_name = PX4_MAIN_MODES.get(main, f"MAIN_{main}")
            if main == 4:
                return f"AUTO.{PX4_AUTO_SUB_MODES.get(sub, f'SUB_{sub}')}"
            return main_name
        if self.flavour is Flavour.ARDUPILOT:
            return self._ardupilot().get(custom_mode, f"MODE_{custom_mode}")
        return f"MODE_{custom_mode}"

    def names(self) -> list[str]:
        if self.flavour is Flavour.PX4:
            main = [n for k, n in PX4_MAIN_MODES.items() if k != 4]
            return main + [f"AUTO.{n}" for n in PX4_AUTO_SUB_MODES.values()]
        if self.flavour is Flavour.ARDUPILOT:
            return list(self._ardupilot().values())
        return []

    def custom_mode(self, name: str) -> int:
        """The custom_mode number for DO_SET_MODE param2, or raise UnknownMode."""
        wanted = name.strip().upper()
        if self.flavour is Flavour.PX4:
            if wanted.startswith("AUTO."):
                sub = {v: k for k, v in PX4_AUTO_SUB_MODES.items()}.get(wanted[5:])
                if sub is not None:
                    return (sub << 24) | (4 << 16)
            else:
                main = {v: k for k, v in PX4_MAIN_MODES.items() if k != 4}.get(wanted)
                if main is not None:
                    return main << 16
        elif self.flavour is Flavour.ARDUPILOT:
            num = {v: k for k, v in self._ardupilot().items()}.get(wanted)
            if num is not None:
                return num
        raise UnknownMode(name, self.names())

    def is_recovery(self, name: str) -> bool:
        return name in RECOVERY_MODES


def flavour_of(autopilot: int) -> Flavour:
    if autopilot == mavlink2.MAV_AUTOPILOT_ARDUPILOTMEGA:
        return Flavour.ARDUPILOT
    if autopilot == mavlink2.MAV_AUTOPILOT_PX4:
        return Flavour.PX4
    return Flavour.GENERIC


def vehicle_class_of(mav_type: int) -> VehicleClass:
    if mav_type in _PLANE_TYPES:
        return VehicleClass.PLANE
    if mav_type in _ROVER_TYPES:
        return VehicleClass.ROVER
    return VehicleClass.COPTER


def table_for(autopilot: int, mav_type: int) -> ModeTable:
    return ModeTable(flavour=flavour_of(autopilot), vehicle_class=vehicle_class_of(mav_type))

