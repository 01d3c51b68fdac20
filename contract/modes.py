"""Autopilot flavours and their flight-mode tables. Pure data and functions of MAVLink numbers.

ArduPilot puts a per-vehicle-type mode number in HEARTBEAT.custom_mode. PX4
packs a main mode in bits 16-23 and a sub mode in bits 24-31.

In the contract, not the drivers, so that everything decoding a mode (the
gateway's telemetry through `mavjet.drivers.mavlink.modes`, which re-exports
this module, and analytics' synthetic history, which may import only the
contract) reads the one table. The MAVLink enum values it needs are written
as numbers (no pymavlink here); tests/drivers/test_modes.py holds them to
pymavlink's dialect.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from mavjet.contract.errors import MavjetError

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

# MAV_AUTOPILOT values.
MAV_AUTOPILOT_ARDUPILOTMEGA = 3
MAV_AUTOPILOT_PX4 = 12
# MAV_TYPE values: FIXED_WING 1; VTOL_DUOROTOR 19, VTOL_QUADROTOR 20, VTOL_TILTROTOR 21, VTOL_GYRODYNE 47;
# GROUND_ROVER 10, SURFACE_BOAT 11.
PLANE_TYPES = frozenset({1, 19, 20, 21, 47})
ROVER_TYPES = frozenset({10, 11})

# Modes an autopilot enters on its own to protect the vehicle. A reconciler
# must never switch away from these: fighting the autopilot's own failsafe
# action could crash the vehicle it is trying to save.
RECOVERY_MODES = frozenset(
    {"RTL", "LAND", "SMART_RTL", "AUTO_RTL", "QRTL", "QLAND", "BRAKE", "AUTO.RTL", "AUTO.LAND", "AUTO.PRECLAND"}
)


def px4_unpack(custom_mode: int) -> tuple[int, int]:
    """PX4's (main mode, sub mode) from HEARTBEAT.custom_mode: bits 16-23 and 24-31."""
    return (custom_mode >> 16) & 0xFF, (custom_mode >> 24) & 0xFF


def px4_pack(main: int, sub: int = 0) -> int:
    """HEARTBEAT.custom_mode of PX4's (main mode, sub mode): `px4_unpack`'s inverse."""
    return (sub << 24) | (main << 16)


def canonical_mode(name: str) -> str:
    """A mode name as the tables spell it: `guided ` is GUIDED, `auto.loiter` is AUTO.LOITER."""
    return name.strip().upper()


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


# Modes in which an ArduPilot vehicle accepts MAV_CMD_NAV_TAKEOFF, by vehicle class (PX4 switches to
# AUTO.TAKEOFF itself, from any mode but a recovery one).
ARDUPILOT_TAKEOFF_MODES: dict[str, frozenset[str]] = {
    VehicleClass.COPTER: frozenset({"GUIDED"}),
    VehicleClass.PLANE: frozenset({"GUIDED", "TAKEOFF", "AUTO"}),
}


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
            main, sub = px4_unpack(custom_mode)
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
        wanted = canonical_mode(name)
        if self.flavour is Flavour.PX4:
            if wanted.startswith("AUTO."):
                sub = {v: k for k, v in PX4_AUTO_SUB_MODES.items()}.get(wanted[5:])
                if sub is not None:
                    return px4_pack(4, sub)
            else:
                main = {v: k for k, v in PX4_MAIN_MODES.items() if k != 4}.get(wanted)
                if main is not None:
                    return px4_pack(main)
        elif self.flavour is Flavour.ARDUPILOT:
            num = {v: k for k, v in self._ardupilot().items()}.get(wanted)
            if num is not None:
                return num
        raise UnknownMode(name, self.names())

    def is_recovery(self, name: str) -> bool:
        return name in RECOVERY_MODES


def flavour_of(autopilot: int) -> Flavour:
    if autopilot == MAV_AUTOPILOT_ARDUPILOTMEGA:
        return Flavour.ARDUPILOT
    if autopilot == MAV_AUTOPILOT_PX4:
        return Flavour.PX4
    return Flavour.GENERIC


def vehicle_class_of(mav_type: int) -> VehicleClass:
    if mav_type in PLANE_TYPES:
        return VehicleClass.PLANE
    if mav_type in ROVER_TYPES:
        return VehicleClass.ROVER
    return VehicleClass.COPTER


def table_for(autopilot: int, mav_type: int) -> ModeTable:
    return ModeTable(flavour=flavour_of(autopilot), vehicle_class=vehicle_class_of(mav_type))

