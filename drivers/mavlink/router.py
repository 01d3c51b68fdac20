"""Sans-IO MAVLink routing: mavlink-router's rules for frames passed through untouched.

The gateway forwards whole frames, as bytes, between the vehicle and each
route (a ground station's UDP/TCP endpoint, or the NATS tunnel). Nothing is
re-encoded, so a signed frame keeps its signature and the ground station
verifies it with its own key.

- `FrameSplitter` cuts a byte stream into whole, CRC-valid frames (MAVLink 1
  and 2, signature included) without decoding them.
- `Router` decides where a frame goes: every vehicle frame to every route
  whose filter accepts its source (sysid/compid), every route frame to the
  vehicle, and a route frame also to the other routes the way mavlink-router's
  `Endpoint::accept_msg` decides: never back to the route it came from (nor
  to one where its source was seen), only through the other route's source
  filter, and only when it is broadcast (no target, or target_system 0) or
  its target (sysid, and compid unless that is 0) has been seen on that route.
  Loop prevention as mavlink-router does it: a source (sysid,
  compid) is remembered on the side it was first seen; a frame coming back
  from another side within `loop_window_s` is a loop (a route that echoes, two
  routes to the same ground station) and is dropped, counted.
- `TransferGuard` tells which route frames start or end a mission-protocol
  transfer, so the gateway can keep a ground station's transfer and its own
  from interleaving on the vehicle (see gateway/routes.py).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from fastcrc import crc16

from mavjet.drivers.mavlink.dialect import mavlink2

_crc = crc16.mcrf4xx
_CRC_EXTRA: Final = {msgid: cls.crc_extra for msgid, cls in mavlink2.mavlink_map.items()}
MAX_FRAME: Final = 280  # MAVLink 2: 10 header + 255 payload + 2 CRC + 13 signature


def frame_source(frame: bytes) -> tuple[int, int]:
    """(sysid, compid) of one whole frame."""
    if frame[0] == 0xFD:
        return frame[5], frame[6]
    return frame[3], frame[4]


def _target_offsets() -> dict[int, tuple[int, int | None]]:
    """msgid -> (offset of target_system, offset of target_component or None) in the wire payload."""
    out: dict[int, tuple[int, int | None]] = {}
    for msgid, cls in mavlink2.mavlink_map.items():
        names = list(cls.ordered_fieldnames)
        if "target_system" not in names:
            continue
        codes = re.findall(r"\d*[a-zA-Z?]", cls.unpacker.format.lstrip("<"))
        offsets = {n: struct.calcsize("<" + "".join(codes[:k])) for k, n in enumerate(names)}
        out[msgid] = (offsets["target_system"], offsets.get("target_component"))
    return out


_TARGETS: Final = _target_offsets()


def frame_target(frame: bytes) -> tuple[int, int]:
    """(target_system, target_component) of a frame; 0 for a message without one (broadcast) or a trimmed zero."""
    msgid = frame_msgid(frame)
    offs = _TARGETS.get(msgid)
    if offs is None:
        return 0, 0
    head = 10 if frame[0] == 0xFD else 6
    plen = frame[1]
    ts = frame[head + offs[0]] if offs[0] < plen else 0
    tc = frame[head + offs[1]] if offs[1] is not None and offs[1] < plen else 0
    return ts, tc


def frame_msgid(frame: bytes) -> int:
    if frame[0] == 0xFD:
        return frame[7] | (frame[8] << 8) | (frame[9] << 16)
    return frame[5]


class FrameSplitter:
    """Feed bytes, get whole CRC-valid frames (bytes); junk between frames is skipped and counted."""

    __slots__ = ("_buf", "junk_bytes")

    def __init__(self) -> None:
        self._buf = b""
        self.junk_bytes = 0

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf + data if self._buf else data
        out: list[bytes] = []
        n = len(buf)
        i = 0
        while i < n:
            b0 = buf[i]
            if b0 == 0xFD:
                if n - i < 10:
                    break
                end = i + 12 + buf[i + 1] + (13 if buf[i + 2] & 0x01 else 0)
                msgid = buf[i + 7] | (buf[i + 8] << 8) | (buf[i + 9] << 16)
                crc_end = i + 10 + buf[i + 1]
            elif b0 == 0xFE:
                if n - i < 6:
                    break
                end = i + 8 + buf[i + 1]
                msgid = buf[i + 5]
                crc_end = end - 2
            else:
                j = min((x for x in (buf.find(b"\xfd", i), buf.find(b"\xfe", i)) if x >= 0), default=n)
                self.junk_bytes += j - i
                i = j
                continue
            if end > n:
                break
            extra = _CRC_EXTRA.get(msgid)
            if extra is None or _crc(bytes((extra,)), _crc(buf[i + 1 : crc_end])) != (buf[crc_end] | (buf[crc_end + 1] << 8)):
                self.junk_bytes += 1  # not a frame start after all (or a message we cannot check)
                i += 1
                continue
            out.append(buf[i:end])
            i = end
        self._buf = buf[i:] if i < n else b""
        if len(self._buf) > MAX_FRAME:
            self.junk_bytes += len(self._buf)
            self._buf = b""
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class RouteFilter:
    """Which vehicle-side frames a route receives, by source; empty means all."""

    sysids: frozenset[int] = frozenset()
    compids: frozenset[int] = frozenset()

    def accepts(self, sysid: int, compid: int) -> bool:
        return (not self.sysids or sysid in self.sysids) and (not self.compids or compid in self.compids)


@dataclass(slots=True)
class RouteStats:
    frames_out: int = 0  # vehicle -> route
    bytes_out: int = 0
    frames_in: int = 0  # route -> vehicle
    bytes_in: int = 0
    filtered: int = 0  # vehicle frames the route's filter refused
    loops: int = 0  # route frames dropped by loop prevention
    frames_routed: int = 0  # frames from another route (route -> route), also counted in frames_out
    dropped: int = 0  # frames lost to a full buffer or a failed send
    refused: int = 0  # transfers refused because another was in progress


VEHICLE: Final = "vehicle"  # the side name of the vehicle in the source table


@dataclass(slots=True)
class Router:
    """Where frames go (see the module docstring). Times are monotonic seconds, passed in."""

    filters: dict[str, RouteFilter] = field(default_factory=dict)
    loop_window_s: float = 5.0
    stats: dict[str, RouteStats] = field(default_factory=dict)
    # (sysid, compid) -> (side it was seen on, when last seen)
    seen: dict[tuple[int, int], tuple[str, float]] = field(default_factory=dict)
    # side -> the (sysid, compid) last seen there: where a targeted route frame may go
    ids: dict[str, set[tuple[int, int]]] = field(default_factory=dict)

    def add_route(self, name: str, flt: RouteFilter | None = None) -> RouteStats:
        self.filters[name] = flt or RouteFilter()
        return self.stats.setdefault(name, RouteStats())

    def _learn(self, side: str, src: tuple[int, int], now_s: float) -> bool:
        """Record `src` on `side`; False when it was seen on another side within the loop window."""
        prev = self.seen.get(src)
        if prev is not None and prev[0] != side:
            if now_s - prev[1] < self.loop_window_s:
                return False
            self.ids.get(prev[0], set()).discard(src)  # it moved: targeted frames follow it
        if prev is None or prev[0] != side:
            self.ids.setdefault(side, set()).add(src)
        self.seen[src] = (side, now_s)
        return True

    def from_vehicle(self, frame: bytes, now_s: float) -> list[str]:
        """The routes a vehicle frame goes to."""
        src = frame_source(frame)
        if not self._learn(VEHICLE, src, now_s):
            return []  # a route's own frame echoed back by the vehicle side: never send it back out
        out: list[str] = []
        for name, flt in self.filters.items():
            if flt.accepts(*src):
                out.append(name)
            else:
                self.stats[name].filtered += 1
        return out

    def to_routes(self, name: str, frame: bytes) -> list[str]:
        """The other routes a frame from route `name` goes to (call after `from_route` accepted it)."""
        src = frame_source(frame)
        ts, tc = frame_target(frame)
        out: list[str] = []
        for other, flt in self.filters.items():
            if other == name:
                continue  # never back where it came from
            known = self.ids.get(other, ())
            if src in known:
                continue
            if not flt.accepts(*src):
                self.stats[other].filtered += 1
                continue
            if ts == 0 or (tc != 0 and (ts, tc) in known) or (tc == 0 and any(s == ts for s, _ in known)):
                out.append(other)
        return out

    def from_route(self, name: str, frame: bytes, now_s: float) -> bool:
        """True when a frame from route `name` goes to the vehicle."""
        st = self.stats[name]
        if not self._learn(name, frame_source(frame), now_s):
            st.loops += 1
            return False
        st.frames_in += 1
        st.bytes_in += len(frame)
        return True


class TransferStep(StrEnum):
    NONE = "none"
    START = "start"  # MISSION_COUNT, MISSION_REQUEST_LIST, MISSION_CLEAR_ALL
    PART = "part"  # any other mission-protocol frame
    END = "end"  # MISSION_ACK


_M = mavlink2
_STARTS: Final = frozenset({_M.MAVLINK_MSG_ID_MISSION_COUNT, _M.MAVLINK_MSG_ID_MISSION_REQUEST_LIST,
                            _M.MAVLINK_MSG_ID_MISSION_CLEAR_ALL})
_PARTS: Final = frozenset({_M.MAVLINK_MSG_ID_MISSION_ITEM, _M.MAVLINK_MSG_ID_MISSION_ITEM_INT,
                           _M.MAVLINK_MSG_ID_MISSION_REQUEST, _M.MAVLINK_MSG_ID_MISSION_REQUEST_INT})


def transfer_step(frame: bytes) -> TransferStep:
    """What a frame means for the mission protocol (missions, fences and rally points share it)."""
    msgid = frame_msgid(frame)
    if msgid in _STARTS:
        return TransferStep.START
    if msgid == _M.MAVLINK_MSG_ID_MISSION_ACK:
        return TransferStep.END
    if msgid in _PARTS:
        return TransferStep.PART
    return TransferStep.NONE


def mission_type_of(frame: bytes) -> int:
    """mission_type of a MISSION_COUNT / REQUEST_LIST / CLEAR_ALL frame (0 when the extension is trimmed)."""
    msgid = frame_msgid(frame)
    if frame[0] != 0xFD:
        return 0
    payload = frame[10 : 10 + frame[1]]
    # The extension's offset in the wire payload: after the base fields.
    offset = {_M.MAVLINK_MSG_ID_MISSION_COUNT: 4, _M.MAVLINK_MSG_ID_MISSION_REQUEST_LIST: 2,
              _M.MAVLINK_MSG_ID_MISSION_CLEAR_ALL: 2}.get(msgid)
    if offset is None or len(payload) <= offset:
        return 0
    return payload[offset]


def refusal(frame: bytes, *, vehicle_sysid: int, vehicle_compid: int) -> bytes:
    """A MISSION_ACK(DENIED) from the vehicle's ids answering a transfer start a ground station sent."""
    sysid, compid = frame_source(frame)
    mav = _M.MAVLink(None, srcSystem=vehicle_sysid, srcComponent=vehicle_compid)
    msg = _M.MAVLink_mission_ack_message(sysid, compid, _M.MAV_MISSION_DENIED, mission_type_of(frame))
    data: bytes = msg.pack(mav)
    return data
