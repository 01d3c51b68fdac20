"""One stored mission, fence or rally item, as MISSION_ITEM_INT carries it.

Its own module so that the stored forms (`mavjet.sim.missions` for ArduPilot's,
`mavjet.sim.px4form` for PX4's) and the transfer protocol that uses both can
share it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from pymavlink.dialects.v20 import ardupilotmega as mavlink2

MISSION: Final = 0  # MAV_MISSION_TYPE_MISSION, an item's default list


@dataclass(frozen=True, slots=True, kw_only=True)
class SimMissionItem:
    """One stored item, as MISSION_ITEM_INT carries it (x/y are degE7 for global frames)."""

    seq: int
    frame: int
    command: int
    current: int = 0
    autocontinue: int = 1
    param1: float = 0.0
    param2: float = 0.0
    param3: float = 0.0
    param4: float = 0.0
    x: int = 0
    y: int = 0
    z: float = 0.0
    mission_type: int = MISSION

    @property
    def lat_deg(self) -> float:
        return self.x / 1e7

    @property
    def lon_deg(self) -> float:
        return self.y / 1e7

    @classmethod
    def from_msg(cls, msg: Any) -> SimMissionItem:
        is_int = msg.get_type() == "MISSION_ITEM_INT"
        x = int(msg.x) if is_int else round(msg.x * 1e7)
        y = int(msg.y) if is_int else round(msg.y * 1e7)
        return cls(
            seq=int(msg.seq),
            frame=int(msg.frame),
            command=int(msg.command),
            current=int(msg.current),
            autocontinue=int(msg.autocontinue),
            param1=float(msg.param1),
            param2=float(msg.param2),
            param3=float(msg.param3),
            param4=float(msg.param4),
            x=x,
            y=y,
            z=float(msg.z),
            mission_type=int(getattr(msg, "mission_type", 0)),
        )

    def to_msg(self, target_system: int, target_component: int, *, as_int: bool = True) -> Any:
        if as_int:
            return mavlink2.MAVLink_mission_item_int_message(
                target_system, target_component, self.seq, self.frame, self.command, self.current,
                self.autocontinue, self.param1, self.param2, self.param3, self.param4, self.x, self.y,
                self.z, self.mission_type,
            )  # fmt: skip
        return mavlink2.MAVLink_mission_item_message(
            target_system, target_component, self.seq, self.frame, self.command, self.current,
            self.autocontinue, self.param1, self.param2, self.param3, self.param4, self.x / 1e7,
            self.y / 1e7, self.z, self.mission_type,
        )  # fmt: skip
