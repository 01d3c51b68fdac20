"""Flight modes as each autopilot flavour names and encodes them.

The simulator implements a handful of *behaviours* (hold, guided, auto, rtl,
land); a flavour maps its own mode names onto them and encodes them into
HEARTBEAT.custom_mode the way the real firmware does:

- ArduCopter: custom_mode is the mode number (GUIDED 4, RTL 6, ...).
- PX4: custom_mode packs main mode in bits 16-23 and sub mode in bits 24-31
  (AUTO.MISSION is main 4, sub 4 → 0x04040000).

Kept separate from `mavjet.drivers.mavlink.modes` on purpose: the simulator is the
gateway's test peer, and a table shared by both could hide a wrong number.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from pymavlink.dialects.v20 import ardupilotmega as mavlink2

Behaviour = Literal["hold", "guided", "auto", "rtl", "land"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Mode:
    name: str
    custom_mode: int
    behaviour: Behaviour
    armable: bool  # may the vehicle arm in this mode (GCS arming)
    needs_position: bool  # refused without a GPS fix and a settled EKF
    user_takeoff: bool  # accepts MAV_CMD_NAV_TAKEOFF


@dataclass(frozen=True, slots=True, kw_only=True)
class SimFlavour:
    name: str
    autopilot: int  # HEARTBEAT.autopilot
    modes: tuple[Mode, ...]
    initial: str  # mode after boot
    guided: str  # mode for goto / DO_REPOSITION
    takeoff: str | None  # mode switched to by NAV_TAKEOFF (PX4), None: stay (ArduPilot)
    after_takeoff: str | None  # mode once a takeoff completes (PX4), None: stay
    hold: str  # where a finished mission or takeoff rests
    auto: str
    rtl: str
    land: str
    version: tuple[int, int, int]

    def by_name(self, name: str) -> Mode | None:
        for m in self.modes:
            if m.name == name:
                return m
        return None

    def by_custom(self, custom_mode: int) -> Mode | None:
        for m in self.modes:
            if m.custom_mode == custom_mode:
                return m
        return None


def px4_custom(main: int, sub: int = 0) -> int:
    return (main << 16) | (sub << 24)


def _ap(name: str, number: int, behaviour: Behaviour, *, armable: bool, pos: bool, takeoff: bool = False) -> Mode:
    return Mode(name=name, custom_mode=number, behaviour=behaviour, armable=armable, needs_position=pos, user_takeoff=takeoff)


ARDUPILOT: Final = SimFlavour(
    name="ardupilot",
    autopilot=mavlink2.MAV_AUTOPILOT_ARDUPILOTMEGA,
    modes=(
        _ap("STABILIZE", 0, "hold", armable=True, pos=False),
        _ap("ALT_HOLD", 2, "hold", armable=True, pos=False),
        _ap("AUTO", 3, "auto", armable=False, pos=True),
        _ap("GUIDED", 4, "guided", armable=True, pos=True, takeoff=True),
        _ap("LOITER", 5, "hold", armable=True, pos=True, takeoff=True),
        _ap("RTL", 6, "rtl", armable=False, pos=True),
        _ap("LAND", 9, "land", armable=False, pos=False),
        _ap("POSHOLD", 16, "hold", armable=True, pos=True, takeoff=True),
        _ap("BRAKE", 17, "hold", armable=False, pos=True),
        _ap("SMART_RTL", 21, "rtl", armable=False, pos=True),
    ),
    initial="STABILIZE",
    guided="GUIDED",
    takeoff=None,
    after_takeoff=None,
    hold="GUIDED",
    auto="AUTO",
    rtl="RTL",
    land="LAND",
    version=(4, 7, 0),  # ArduCopter V4.7.0-dev, as the recorded SITL (flight_sw_version 0x04070000)
)

PX4: Final = SimFlavour(
    name="px4",
    autopilot=mavlink2.MAV_AUTOPILOT_PX4,
    modes=(
        _ap("MANUAL", px4_custom(1), "hold", armable=True, pos=False, takeoff=True),
        _ap("ALTCTL", px4_custom(2), "hold", armable=True, pos=False, takeoff=True),
        _ap("POSCTL", px4_custom(3), "hold", armable=True, pos=True, takeoff=True),
        _ap("AUTO.TAKEOFF", px4_custom(4, 2), "guided", armable=True, pos=True, takeoff=True),
        _ap("AUTO.LOITER", px4_custom(4, 3), "guided", armable=True, pos=True, takeoff=True),
        _ap("AUTO.MISSION", px4_custom(4, 4), "auto", armable=True, pos=True, takeoff=True),
        _ap("AUTO.RTL", px4_custom(4, 5), "rtl", armable=False, pos=True, takeoff=True),
        _ap("AUTO.LAND", px4_custom(4, 6), "land", armable=False, pos=False, takeoff=True),
        _ap("OFFBOARD", px4_custom(6), "guided", armable=True, pos=True, takeoff=True),
        _ap("STABILIZED", px4_custom(7), "hold", armable=True, pos=False, takeoff=True),
    ),
    initial="AUTO.LOITER",
    guided="AUTO.LOITER",
    takeoff="AUTO.TAKEOFF",
    after_takeoff="AUTO.LOITER",
    hold="AUTO.LOITER",
    auto="AUTO.MISSION",
    rtl="AUTO.RTL",
    land="AUTO.LAND",
    version=(1, 15, 4),
)

FLAVOURS: Final = {"ardupilot": ARDUPILOT, "px4": PX4}
