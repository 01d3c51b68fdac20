"""Read-back normalisation: the form in which an autopilot returns an uploaded item.

An autopilot does not store MISSION_ITEM_INT fields verbatim: it converts each
item into its own storage form and converts it back on download. An upload is
verified by comparing *normalised* forms, `readback(sent, flavour)` against
the item read back, never raw fields. Pure functions, no I/O.

ArduPilot (`AP_Mission::mavlink_int_to_mission_cmd` / `mission_cmd_to_mavlink_int`,
`MissionItemProtocol_Fence` / `_Rally`), checked against a real ArduCopter
(V4.7.0-dev) read-back:

- Each command keeps only the params it stores, in the storage type of its
  field; every other param reads back 0 (so a NaN "unused" param4 reads back 0).
  Integer fields truncate toward zero (`uint16` p1: NAV_WAYPOINT delay,
  LOITER_TIME seconds, ...). Sign flags read back as +1/-1: NAV_LAND param4
  (yaw direction: NaN or >= 0 reads back 1), LOITER_TIME param3 (loiter
  direction: 50 reads back 1). "xtrack" flags read back 1 when > 0, else 0.
- Commands with a location ("positional") read back in frame GLOBAL (0),
  GLOBAL_RELATIVE_ALT (3) or GLOBAL_TERRAIN_ALT (10): the _INT variants and
  MAV_FRAME_MISSION map onto those. The altitude is stored in whole
  centimetres (truncated), so z reads back as float32(cm / 100).
- Commands without a location (DO_CHANGE_SPEED, RTL, DO_JUMP, ...) read back
  in frame 0 with x = y = z = 0.
- Mission items read back with autocontinue 1; fence and rally items with
  autocontinue 0. Rally points read back in frame 3 with z in whole metres.
- `current` always reads back 0.
- Seq 0 of a MISSION is the home position, which ArduPilot replaces with its
  live home: it is compared by nobody (see `plan.digest`).
- Commands missing from the table are kept as sent (float32 rounding only).
  ArduPlane stores NAV_WAYPOINT's param2/param3 instead of param1; the table
  is ArduCopter's (and Rover's), the vehicles mavjet flies.

PX4 (`MavlinkMissionManager::parse_mavlink_mission_item` /
`format_mavlink_mission_item` in src/modules/mavlink/mavlink_mission.cpp, not
yet checked against a real PX4): an item in a global frame (0, 3 and their
_INT variants) is stored as a `mission_item_s` and reads back in that frame
with only the fields the command keeps (NAV_WAYPOINT p1 hold time, p2
acceptance radius, p4 yaw; LOITER_TIME p1, p2 and p4 as 0/1 flags, p3
radius; NAV_LAND p2 precision-land mode, p4 yaw; NAV_TAKEOFF p4 yaw;
LOITER_UNLIM p3, p4 yaw; LOITER_TO_ALT p1/p4 flags, p2; fence vertex p1
rounded to a count; fence circle p1 radius); every other param reads back 0.
Yaw goes through radians and back, wrapped to [0, 360) (compared to 1e-3
degree). An item in frame MISSION (2) keeps params 1-7 as sent (DO_JUMP's
p1/p2 as integers). Fence points are stored without `autocontinue` (read
back 0); mission and rally items keep it.

Generic autopilots: float32 params, int32 lat/lon, `current` 0, the _INT
frame variants equal to the plain ones, fence/rally autocontinue ignored (0),
and NaN params equal to 0 (PX4 too: NaN compares as 0).

Every flavour's table lives here, side by side, so that a difference between
autopilots is read in one place.

`digest_form(item)` is the flavour-independent form the mission digest is
computed on: the ArduPilot form, the coarsest of the tables (it drops what
ArduPilot drops), so one `desired.mission` digest fits a mixed fleet and the
digest of a plan equals the digest of its read-back on every flavour.

Most of the module is those per-flavour tables (which params each MAV_CMD
uses and how each autopilot stores them), kept beside the one function that
reads them.
"""

from __future__ import annotations

import enum
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass, replace

from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.drivers.mavlink.mission import FENCE, RALLY, MissionItem
from mavjet.drivers.mavlink.modes import Flavour

__all__ = [
    "ARDUPILOT_RULES", "CommandRule", "ItemProblem", "P", "check_item", "command_name", "differences",
    "digest_form", "f32", "is_positional", "readback", "same_item",
]  # fmt: skip

M = mavlink2


def f32(value: float) -> float:
    """`value` as the float32 a MAVLink float field carries."""
    if math.isnan(value):
        return math.nan
    try:
        return float(struct.unpack("<f", struct.pack("<f", value))[0])
    except OverflowError:
        return math.copysign(math.inf, value)


class P(enum.Enum):
    """How one param is stored (and so read back)."""

    ZERO = "zero"  # not stored: reads back 0
    FLOAT = "float"  # float32
    U8 = "u8"
    I8 = "i8"
    U16 = "u16"
    I16 = "i16"
    SIGN = "sign"  # stored as a direction bit: < 0 reads back -1, anything else (NaN too) 1
    FLAG = "flag"  # stored as a bit: > 0 reads back 1, else 0


_INT_RANGES = {P.U8: (0, 8, False), P.I8: (0, 8, True), P.U16: (0, 16, False), P.I16: (0, 16, True)}


def _store(kind: P, value: float) -> float:
    if kind is P.ZERO:
        return 0.0
    if kind is P.FLOAT:
        return (
            0.0 if math.isnan(value) else f32(value)
        )  # ArduPilot refuses NaN here (check_item); 0 keeps forms comparable
    if kind is P.SIGN:
        return -1.0 if value < 0 else 1.0  # NaN < 0 is False, as in C
    if kind is P.FLAG:
        return 1.0 if value > 0 else 0.0
    if math.isnan(value) or math.isinf(value):
        return 0.0  # undefined in C; ArduPilot refuses NaN before it gets here
    _, bits, signed = _INT_RANGES[kind]
    n = int(f32(value)) & ((1 << bits) - 1)  # C's float -> int truncates, the narrow store wraps
    if signed and n >= 1 << (bits - 1):
        n -= 1 << bits
    return float(n)


@dataclass(frozen=True, kw_only=True, slots=True)
class CommandRule:
    """What an autopilot stores of one MAV_CMD: the four params, and whether it has a location."""

    params: tuple[P, P, P, P]
    positional: bool


Z, F = P.ZERO, P.FLOAT
_POS = True


def _r(p1: P, p2: P, p3: P, p4: P, positional: bool = False) -> CommandRule:
    return CommandRule(params=(p1, p2, p3, p4), positional=positional)


#: ArduCopter/Rover: MAV_CMD -> storage rule (AP_Mission.cpp, both conversion directions).
ARDUPILOT_RULES: dict[int, CommandRule] = {
    M.MAV_CMD_NAV_WAYPOINT: _r(P.U16, Z, Z, Z, _POS),  # p1 = delay s
    M.MAV_CMD_NAV_LOITER_UNLIM: _r(
        Z, Z, F, Z, _POS
    ),  # radius |p3| as u16 with a sign: see _ardupilot_params
    M.MAV_CMD_NAV_LOITER_TURNS: _r(P.U8, Z, F, P.FLAG, _POS),  # p3 radius: u8 with sign (special)
    M.MAV_CMD_NAV_LOITER_TIME: _r(P.U16, Z, P.SIGN, P.FLAG, _POS),
    M.MAV_CMD_NAV_RETURN_TO_LAUNCH: _r(Z, Z, Z, Z),
    M.MAV_CMD_NAV_LAND: _r(P.U16, Z, Z, P.SIGN, _POS),
    M.MAV_CMD_NAV_TAKEOFF: _r(P.U16, Z, Z, Z, _POS),
    M.MAV_CMD_NAV_CONTINUE_AND_CHANGE_ALT: _r(P.U16, Z, Z, Z, _POS),
    M.MAV_CMD_NAV_LOITER_TO_ALT: _r(Z, F, Z, P.FLAG, _POS),  # p2 radius: u16 with sign (special)
    M.MAV_CMD_NAV_SPLINE_WAYPOINT: _r(P.U16, Z, Z, Z, _POS),
    M.MAV_CMD_NAV_GUIDED_ENABLE: _r(P.U16, Z, Z, Z, _POS),
    M.MAV_CMD_NAV_DELAY: _r(F, P.I8, P.I8, P.I8),
    M.MAV_CMD_CONDITION_DELAY: _r(F, Z, Z, Z),
    M.MAV_CMD_CONDITION_DISTANCE: _r(F, Z, Z, Z),
    M.MAV_CMD_CONDITION_YAW: _r(F, F, P.I8, P.U8),
    M.MAV_CMD_DO_SET_MODE: _r(P.U16, Z, Z, Z),
    M.MAV_CMD_DO_JUMP: _r(P.U16, P.I16, Z, Z),
    M.MAV_CMD_DO_CHANGE_SPEED: _r(P.U8, F, F, Z),
    M.MAV_CMD_DO_SET_HOME: _r(P.U16, Z, Z, Z, _POS),
    M.MAV_CMD_DO_SET_RELAY: _r(P.U8, P.U8, Z, Z),
    M.MAV_CMD_DO_REPEAT_RELAY: _r(P.U8, P.I16, F, Z),
    M.MAV_CMD_DO_SET_SERVO: _r(P.U8, P.U16, Z, Z),
    M.MAV_CMD_DO_REPEAT_SERVO: _r(P.U8, P.U16, P.I16, F),
    M.MAV_CMD_DO_LAND_START: _r(Z, Z, Z, Z, _POS),
    M.MAV_CMD_DO_GO_AROUND: _r(Z, Z, Z, Z, _POS),
    M.MAV_CMD_DO_SET_ROI: _r(P.U16, Z, Z, Z, _POS),
    M.MAV_CMD_DO_MOUNT_CONTROL: _r(F, F, F, Z),
    M.MAV_CMD_DO_SET_CAM_TRIGG_DIST: _r(F, Z, Z, Z),
    M.MAV_CMD_DO_FENCE_ENABLE: _r(P.U16, Z, Z, Z),
    M.MAV_CMD_DO_PARACHUTE: _r(P.U16, Z, Z, Z),
    M.MAV_CMD_DO_GRIPPER: _r(P.U8, P.U8, Z, Z),
    M.MAV_CMD_DO_GUIDED_LIMITS: _r(P.U16, F, F, F),
    M.MAV_CMD_DO_AUTOTUNE_ENABLE: _r(P.U16, Z, Z, Z),
    M.MAV_CMD_NAV_PAYLOAD_PLACE: _r(F, Z, Z, Z, _POS),
    M.MAV_CMD_DO_WINCH: _r(P.U8, P.U8, F, F),
}

_LOCATION_FRAMES = {
    M.MAV_FRAME_GLOBAL: M.MAV_FRAME_GLOBAL,
    M.MAV_FRAME_GLOBAL_INT: M.MAV_FRAME_GLOBAL,
    M.MAV_FRAME_MISSION: M.MAV_FRAME_GLOBAL,
    M.MAV_FRAME_GLOBAL_RELATIVE_ALT: M.MAV_FRAME_GLOBAL_RELATIVE_ALT,
    M.MAV_FRAME_GLOBAL_RELATIVE_ALT_INT: M.MAV_FRAME_GLOBAL_RELATIVE_ALT,
    M.MAV_FRAME_GLOBAL_TERRAIN_ALT: M.MAV_FRAME_GLOBAL_TERRAIN_ALT,
    M.MAV_FRAME_GLOBAL_TERRAIN_ALT_INT: M.MAV_FRAME_GLOBAL_TERRAIN_ALT,
}
#: Frames that differ only by the int/float encoding of x/y.
_INT_FRAME_ALIASES = {M.MAV_FRAME_GLOBAL_INT: M.MAV_FRAME_GLOBAL, M.MAV_FRAME_GLOBAL_RELATIVE_ALT_INT: M.MAV_FRAME_GLOBAL_RELATIVE_ALT,
                      M.MAV_FRAME_GLOBAL_TERRAIN_ALT_INT: M.MAV_FRAME_GLOBAL_TERRAIN_ALT}  # fmt: skip


def _alt_cm(z: float) -> float:
    """ArduPilot's Location.alt: whole centimetres (float32 z * 100, truncated), read back as cm / 100."""
    if math.isnan(z) or math.isinf(z):
        return z
    return f32(int(f32(f32(z) * 100.0)) / 100.0)


def _special_radius(value: float, bits: int) -> float:
    """LOITER_UNLIM/TURNS/TO_ALT radius: |value| in an unsigned field, sign kept as a direction bit."""
    if math.isnan(value):
        return 0.0
    n = int(abs(f32(value))) & ((1 << bits) - 1)
    return -float(n) if value < 0 else float(n)


def _ardupilot(item: MissionItem) -> MissionItem:
    if item.mission_type == FENCE:
        return replace(
            item, current=0, autocontinue=0, frame=_INT_FRAME_ALIASES.get(item.frame, item.frame),
            param1=_store(P.U8, item.param1) if item.command in _POLYGON_VERTICES else _zero_nan(item.param1),
            param2=0.0, param3=0.0, param4=0.0, z=0.0,
        )  # fmt: skip
    if item.mission_type == RALLY:
        z = 0.0 if math.isnan(item.z) else float(int(f32(item.z)))
        return replace(item, current=0, autocontinue=0, frame=M.MAV_FRAME_GLOBAL_RELATIVE_ALT,
                       param1=0.0, param2=0.0, param3=0.0, param4=0.0, z=z)  # fmt: skip
    rule = ARDUPILOT_RULES.get(item.command)
    if rule is None:
        return _generic(item)
    raw = (item.param1, item.param2, item.param3, item.param4)
    p = [_store(kind, v) for kind, v in zip(rule.params, raw, strict=True)]
    if item.command == M.MAV_CMD_NAV_LOITER_UNLIM:
        p[2] = _special_radius(item.param3, 16)
    elif item.command == M.MAV_CMD_NAV_LOITER_TURNS:
        p[2] = _special_radius(item.param3, 8)
    elif item.command == M.MAV_CMD_NAV_LOITER_TO_ALT:
        p[1] = _special_radius(item.param2, 16)
    if rule.positional:
        frame = _LOCATION_FRAMES.get(
            item.frame, item.frame
        )  # another frame is refused by the vehicle
        x, y, z = item.x, item.y, _alt_cm(item.z)
    else:
        frame, x, y, z = M.MAV_FRAME_GLOBAL, 0, 0, 0.0
    return replace(
        item,
        current=0,
        autocontinue=1,
        frame=frame,
        param1=p[0],
        param2=p[1],
        param3=p[2],
        param4=p[3],
        x=x,
        y=y,
        z=z,
    )


_POLYGON_VERTICES = frozenset(
    {M.MAV_CMD_NAV_FENCE_POLYGON_VERTEX_INCLUSION, M.MAV_CMD_NAV_FENCE_POLYGON_VERTEX_EXCLUSION}
)


def _zero_nan(v: float) -> float:
    return 0.0 if math.isnan(v) else f32(v)


def _generic(item: MissionItem) -> MissionItem:
    auto = 0 if item.mission_type in (FENCE, RALLY) else (1 if item.autocontinue else 0)
    return replace(
        item, current=0, autocontinue=auto, frame=_INT_FRAME_ALIASES.get(item.frame, item.frame),
        param1=_zero_nan(item.param1), param2=_zero_nan(item.param2), param3=_zero_nan(item.param3),
        param4=_zero_nan(item.param4), z=_zero_nan(item.z),
    )  # fmt: skip


def _px4_yaw(v: float) -> float:
    """PX4 keeps yaw as wrap_2pi(radians(deg)) and returns degrees(yaw): [0, 360), float32 noise rounded off."""
    if math.isnan(v) or math.isinf(v):
        return 0.0
    return f32(round(v % 360.0, 3) % 360.0)


def _flag(v: float) -> float:
    return 1.0 if v > 0 else 0.0  # NaN > 0 is false, as in C


def _uint(v: float, bits: int) -> float:
    """C's float -> uintN conversion for the values PX4 sees in practice (truncation; NaN/out of range 0)."""
    if not math.isfinite(v) or v < 0 or v >= 2**bits:
        return 0.0
    return float(int(v))


# Positional commands PX4 stores, and how each param is read back (None: not stored, 0).
_Px4Rule = Callable[[float], float] | None
_PX4_POSITIONAL: dict[int, tuple[_Px4Rule, _Px4Rule, _Px4Rule, _Px4Rule]] = {
    M.MAV_CMD_NAV_WAYPOINT: (f32, f32, None, _px4_yaw),
    M.MAV_CMD_NAV_LOITER_UNLIM: (None, None, f32, _px4_yaw),
    M.MAV_CMD_NAV_LOITER_TIME: (f32, _flag, f32, _flag),
    M.MAV_CMD_NAV_LAND: (None, lambda v: _uint(v, 8), None, _px4_yaw),
    M.MAV_CMD_NAV_TAKEOFF: (None, None, None, _px4_yaw),
    M.MAV_CMD_NAV_LOITER_TO_ALT: (_flag, f32, None, _flag),
    M.MAV_CMD_NAV_VTOL_TAKEOFF: (None, None, None, _px4_yaw),
    M.MAV_CMD_NAV_VTOL_LAND: (None, None, None, _px4_yaw),
    M.MAV_CMD_NAV_FENCE_POLYGON_VERTEX_INCLUSION: (lambda v: _uint(v + 0.5, 16), None, None, None),
    M.MAV_CMD_NAV_FENCE_POLYGON_VERTEX_EXCLUSION: (lambda v: _uint(v + 0.5, 16), None, None, None),
    M.MAV_CMD_NAV_FENCE_CIRCLE_INCLUSION: (f32, None, None, None),
    M.MAV_CMD_NAV_FENCE_CIRCLE_EXCLUSION: (f32, None, None, None),
    M.MAV_CMD_NAV_RALLY_POINT: (None, None, None, None),
    # Stored, then read back with every param 0 (format_mavlink_mission_item has no case for them).
    M.MAV_CMD_DO_SET_ROI_LOCATION: (None, None, None, None),
    M.MAV_CMD_DO_SET_ROI: (None, None, None, None),
    M.MAV_CMD_NAV_FENCE_RETURN_POINT: (None, None, None, None),
}


def _px4(item: MissionItem) -> MissionItem:
    frame = _INT_FRAME_ALIASES.get(item.frame, item.frame)
    auto = 0 if item.mission_type == FENCE else (1 if item.autocontinue else 0)
    rules = _PX4_POSITIONAL.get(item.command)
    if frame in (M.MAV_FRAME_GLOBAL, M.MAV_FRAME_GLOBAL_RELATIVE_ALT) and rules is not None:
        raw = (item.param1, item.param2, item.param3, item.param4)
        p = [0.0 if rule is None else _zero_nan(rule(v)) for rule, v in zip(rules, raw, strict=True)]
        return replace(item, current=0, autocontinue=auto, frame=frame, param1=p[0], param2=p[1], param3=p[2],
                       param4=p[3], z=_zero_nan(item.z))  # fmt: skip
    if frame == M.MAV_FRAME_MISSION and item.command == M.MAV_CMD_DO_JUMP:
        item = replace(item, param1=_uint(item.param1, 16), param2=_uint(item.param2, 16))
    # Frame MISSION keeps params 1-7 as sent; anything else PX4 refuses at upload (compared as sent).
    return replace(_generic(item), autocontinue=auto)


def readback(item: MissionItem, flavour: Flavour | str = Flavour.ARDUPILOT) -> MissionItem:
    """The item as an autopilot of `flavour` reads it back after storing it. Idempotent."""
    fl = Flavour(flavour)
    if fl is Flavour.ARDUPILOT:
        return _ardupilot(item)
    if fl is Flavour.PX4:
        return _px4(item)
    return _generic(item)


def _key(item: MissionItem) -> tuple[int | float | str, ...]:
    return item.canonical()


def same_item(
    sent: MissionItem, got: MissionItem, flavour: Flavour | str = Flavour.ARDUPILOT
) -> bool:
    """True when `got` is what the vehicle reads back for `sent` (both normalised)."""
    return _key(readback(sent, flavour)) == _key(readback(got, flavour))


_FIELDS = (
    "frame",
    "command",
    "autocontinue",
    "param1",
    "param2",
    "param3",
    "param4",
    "x",
    "y",
    "z",
)


def differences(
    sent: MissionItem, got: MissionItem, flavour: Flavour | str = Flavour.ARDUPILOT
) -> list[str]:
    """Field-by-field differences between the normalised forms, e.g. `['z: 30.0 != 31.0']`."""
    a, b = readback(sent, flavour), readback(got, flavour)
    out: list[str] = []
    for name in _FIELDS:
        va, vb = getattr(a, name), getattr(b, name)
        if isinstance(va, float) and isinstance(vb, float) and math.isnan(va) and math.isnan(vb):
            continue
        if va != vb:
            out.append(f"{name}: {va!r} != {vb!r}")
    return out


def digest_form(item: MissionItem) -> MissionItem:
    """The flavour-independent form the mission digest hashes (see the module docstring)."""
    return _ardupilot(item)


# ---------------------------------------------------------------------------
# what a vehicle would refuse: checked before an upload, so the result names the item

#: MAV_CMDs whose param4 (yaw) may be NaN on ArduPilot ("unchanged"); every other NaN param is refused.
_NAN_PARAM4_OK = frozenset(
    {
        M.MAV_CMD_NAV_WAYPOINT,
        M.MAV_CMD_NAV_LAND,
        M.MAV_CMD_NAV_TAKEOFF,
        M.MAV_CMD_NAV_VTOL_TAKEOFF,
        M.MAV_CMD_NAV_VTOL_LAND,
    }
)
_INVALID_PARAM = (M.MAV_MISSION_INVALID_PARAM1, M.MAV_MISSION_INVALID_PARAM2, M.MAV_MISSION_INVALID_PARAM3,
                  M.MAV_MISSION_INVALID_PARAM4)  # fmt: skip
_RALLY_FRAMES = frozenset({M.MAV_FRAME_GLOBAL_RELATIVE_ALT, M.MAV_FRAME_GLOBAL_RELATIVE_ALT_INT})


def command_name(command: int) -> str:
    entry = M.enums["MAV_CMD"].get(command)
    return entry.name.removeprefix("MAV_CMD_") if entry is not None else f"MAV_CMD {command}"


def is_positional(command: int) -> bool:
    """True for commands whose x/y/z are a location (ArduPilot's `stored_in_location`)."""
    rule = ARDUPILOT_RULES.get(command)
    return rule is not None and rule.positional


@dataclass(frozen=True, kw_only=True, slots=True)
class ItemProblem:
    """Why a vehicle would refuse one item: the MAV_MISSION_RESULT it would answer, and a sentence."""

    seq: int
    result: int
    reason: str


def check_item(item: MissionItem, flavour: Flavour | str = Flavour.ARDUPILOT) -> ItemProblem | None:
    """The refusal an autopilot of `flavour` would answer for `item`, or None when it would store it."""
    name = command_name(item.command)
    if item.mission_type == RALLY:
        if Flavour(flavour) is Flavour.ARDUPILOT and item.frame not in _RALLY_FRAMES:
            return ItemProblem(
                seq=item.seq,
                result=M.MAV_MISSION_UNSUPPORTED_FRAME,
                reason=f"a rally point must be in frame 3 (GLOBAL_RELATIVE_ALT), got frame {item.frame}",
            )
        if math.isnan(item.z) or not (-32768 <= item.z <= 32767):
            return ItemProblem(
                seq=item.seq,
                result=M.MAV_MISSION_INVALID_PARAM7,
                reason=f"a rally point needs an altitude in [-32768, 32767] m (param7 is {item.z})",
            )
        return None
    if item.mission_type == FENCE:
        return None
    if is_positional(item.command) and math.isnan(item.z):
        return ItemProblem(
            seq=item.seq,
            result=M.MAV_MISSION_INVALID_PARAM7,
            reason=f"{name} in a global frame needs an altitude (param7 is null)",
        )
    if Flavour(flavour) is not Flavour.ARDUPILOT:
        return None
    raw = (item.param1, item.param2, item.param3, item.param4)
    for k, v in enumerate(raw):
        nan_ok = (k == 3 and item.command in _NAN_PARAM4_OK) or (
            k == 2 and item.command == M.MAV_CMD_NAV_VTOL_LAND
        )
        if math.isinf(v) or (math.isnan(v) and not nan_ok):
            return ItemProblem(
                seq=item.seq,
                result=_INVALID_PARAM[k],
                reason=f"{name}: param{k + 1} must be a number (ArduPilot refuses {v})",
            )
    if is_positional(item.command) and item.frame not in _LOCATION_FRAMES:
        return ItemProblem(
            seq=item.seq,
            result=M.MAV_MISSION_UNSUPPORTED_FRAME,
            reason=f"{name}: ArduPilot does not take frame {item.frame} for a location",
        )
    return None
