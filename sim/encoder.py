"""MAVLink 2 framing for many vehicles with one encoder, cheaply.

pymavlink's `msg.pack(mav)` builds a header object, a bytearray and a CRC
object per frame and needs a `MAVLink` instance whose `srcSystem`/`seq` are
the sender's. For the load generator (a thousand vehicles, tens of thousands
of frames a second) the hot telemetry is framed here instead, straight from
field values with the generated class's own `struct` layout and CRC extra;
anything else (STATUSTEXT, PARAM_VALUE, mission items, ...) goes through
pymavlink with the one shared `MAVLink` object re-pointed at the sender.
Both paths produce identical bytes (tested against pymavlink's encoder).
"""

from __future__ import annotations

import operator
import struct
from typing import Any, Final

from fastcrc.crc16 import mcrf4xx as _crc  # a hard dependency of the project (docs/performance.md)
from pymavlink.dialects.v20 import ardupilotmega as mavlink2

_HEADER: Final = struct.Struct("<BBBBBBBHB")
_CRC: Final = struct.Struct("<H")


class Packer:
    """Frames one message type from values given in the dialect's field order (`cls.fieldnames`).

    Only for messages whose fields are scalars (no arrays, no strings): the
    values are reordered into wire order (`ordered_fieldnames`) and packed.
    """

    __slots__ = ("_crc_extra", "_id_hi", "_id_lo", "_order", "_pack", "msg_id", "name")

    def __init__(self, cls: Any) -> None:
        if any(n > 0 for n in getattr(cls, "array_lengths", [])):
            raise ValueError(f"{cls.msgname} has array fields; frame it with pymavlink")
        self.msg_id: int = cls.id
        self.name: str = cls.msgname
        self._pack = cls.unpacker.pack
        self._crc_extra = bytes((cls.crc_extra,))
        self._order = operator.itemgetter(*(cls.fieldnames.index(n) for n in cls.ordered_fieldnames))
        self._id_lo = cls.id & 0xFFFF
        self._id_hi = cls.id >> 16

    def frame(self, sysid: int, compid: int, seq: int, values: tuple[Any, ...]) -> bytes:
        payload = self._pack(*self._order(values))
        payload = payload.rstrip(b"\x00") or b"\x00"  # MAVLink 2 trims trailing zeros, keeps one byte
        header = _HEADER.pack(253, len(payload), 0, 0, seq, sysid, compid, self._id_lo, self._id_hi)
        body = header[1:] + payload
        return header + payload + _CRC.pack(_crc(body + self._crc_extra, 0xFFFF))


class Encoder:
    """One pymavlink `MAVLink` object shared by every vehicle for the cold path."""

    def __init__(self) -> None:
        self._mav = mavlink2.MAVLink(None, 1, 1)

    def frame(self, sysid: int, compid: int, seq: int, msg: Any) -> bytes:
        mav = self._mav
        mav.srcSystem = sysid
        mav.srcComponent = compid
        mav.seq = seq
        return bytes(msg.pack(mav))


HEARTBEAT: Final = Packer(mavlink2.MAVLink_heartbeat_message)
SYS_STATUS: Final = Packer(mavlink2.MAVLink_sys_status_message)
SYSTEM_TIME: Final = Packer(mavlink2.MAVLink_system_time_message)
GPS_RAW_INT: Final = Packer(mavlink2.MAVLink_gps_raw_int_message)
ATTITUDE: Final = Packer(mavlink2.MAVLink_attitude_message)
GLOBAL_POSITION_INT: Final = Packer(mavlink2.MAVLink_global_position_int_message)
VFR_HUD: Final = Packer(mavlink2.MAVLink_vfr_hud_message)
EXTENDED_SYS_STATE: Final = Packer(mavlink2.MAVLink_extended_sys_state_message)
MISSION_CURRENT: Final = Packer(mavlink2.MAVLink_mission_current_message)
FENCE_STATUS: Final = Packer(mavlink2.MAVLink_fence_status_message)
