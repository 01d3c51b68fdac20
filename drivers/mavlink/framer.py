"""A fast, sans-IO MAVLink frame scanner with a fast path for flat messages.

pymavlink's parser walks the buffer a byte at a time through several method
calls and re-checks everything in `decode()`; on this machine that is
~186k msgs/s for a core on the reference machine. Framing here slices whole frames out
of the buffer, checks the CRC with fastcrc in one call and, for messages with
no array or string fields (the telemetry hot path: HEARTBEAT,
GLOBAL_POSITION_INT, ATTITUDE, ...), unpacks and builds the same pymavlink
message object directly. Everything else is handed to pymavlink's own
`decode()`.

Flat messages come back as light objects (`LightMessage` subclasses generated
per type, with `__slots__` and an `__init__` that takes the fields in wire
order): the same attribute names as pymavlink's classes and the accessors the
project uses (`get_type`, `get_srcSystem`, `get_srcComponent`, `get_seq`,
`to_dict`), at a fraction of the construction cost. They are for reading;
outgoing messages are built with pymavlink.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastcrc import crc16

from drivers.mavlink.dialect import mavlink2

MAGIC_V2 = 0xFD
MAGIC_V1 = 0xFE
SIGNED = mavlink2.MAVLINK_IFLAG_SIGNED
_crc = crc16.mcrf4xx


class LightHeader:
    __slots__ = ("compat_flags", "incompat_flags", "mlen", "msgId", "seq", "srcComponent", "srcSystem")

    def __init__(self, msgId: int, incompat_flags: int, compat_flags: int, mlen: int, seq: int,  # noqa: PLR0917
                 srcSystem: int, srcComponent: int) -> None:
        self.msgId = msgId
        self.incompat_flags = incompat_flags
        self.compat_flags = compat_flags
        self.mlen = mlen
        self.seq = seq
        self.srcSystem = srcSystem
        self.srcComponent = srcComponent


class LightMessage:
    """Base of the generated light message classes (see the module docstring)."""

    __slots__ = ("_crc", "_header")
    _type = "UNKNOWN"
    _msgid = -1
    fieldnames: tuple[str, ...] = ()
    _header: LightHeader

    def get_type(self) -> str:
        return self._type

    def get_msgId(self) -> int:
        return self._msgid

    def get_srcSystem(self) -> int:
        return self._header.srcSystem

    def get_srcComponent(self) -> int:
        return self._header.srcComponent

    def get_seq(self) -> int:
        return self._header.seq

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"mavpackettype": self._type}
        for name in self.fieldnames:
            d[name] = getattr(self, name)
        return d

    def __repr__(self) -> str:
        return f"{self._type} {self.to_dict()}"


def _light_class(cls: Any) -> type[LightMessage]:
    """A slotted class whose __init__(header, crc, *wire_values) assigns fields by name."""
    wire_names = list(cls.ordered_fieldnames)
    args = ", ".join(f"v{i}" for i in range(len(wire_names)))
    body = "\n".join(f"    self.{name} = v{i}" for i, name in enumerate(wire_names)) or "    pass"
    src = f"def __init__(self, _h, _c, {args}):\n    self._header = _h\n    self._crc = _c\n{body}\n"
    namespace: dict[str, Any] = {}
    exec(src, namespace)
    return type(
        f"Light_{cls.msgname}", (LightMessage,),
        {"__slots__": tuple(wire_names), "__init__": namespace["__init__"], "_type": cls.msgname, "_msgid": cls.id,
         "fieldnames": tuple(cls.fieldnames)},
    )


@dataclass(frozen=True, slots=True)
class _MsgInfo:
    cls: Any
    crc_extra: int
    unpack: Any
    size: int
    light: Any  # None: pymavlink decode() (arrays or strings)


def _build_table() -> dict[int, _MsgInfo]:
    table: dict[int, _MsgInfo] = {}
    for msgid, cls in mavlink2.mavlink_map.items():
        flat = sum(cls.lengths) == len(cls.lengths) and "s" not in cls.unpacker.format
        table[msgid] = _MsgInfo(
            cls=cls, crc_extra=cls.crc_extra, unpack=cls.unpacker.unpack, size=cls.unpacker.size,
            light=_light_class(cls) if flat else None,
        )
    return table


_TABLE = _build_table()


@dataclass(slots=True)
class FramerStats:
    crc_errors: int = 0
    unknown: int = 0
    # Stretches of bytes that were not a valid frame (one per stretch, however long: a
    # health counter counts broken frames, not bytes). Bytes before the first valid frame
    # after `resync()` (a connect starts mid-frame, SITL prints a console banner) are not counted.
    bad_data: int = 0
    bad_bytes: int = 0  # the bytes of those stretches, for diagnosis
    unverified: int = 0  # valid frames the signature check refused (see drivers/mavlink/signing.py)


# Judges one complete, CRC-valid frame (bytes, message id): keep it or drop it.
FrameCheck = Callable[[bytes, int], bool]


class Framer:
    """Feed bytes, get pymavlink messages. Keeps an incomplete frame for the next feed."""

    def __init__(self, mav: Any, *, check: FrameCheck | None = None) -> None:
        self._mav = mav  # pymavlink MAVLink object, for decode() of non-flat messages
        # Signature verification, only on links with a signing key: the unsigned
        # hot path pays one `is not None` test per frame and nothing else.
        self._check = check
        self._buf = b""
        self.stats = FramerStats()
        self._synced = True  # False until the first valid frame after resync()
        self._in_junk = False  # inside a stretch already counted in bad_data

    def _junk(self, nbytes: int) -> None:
        if not self._synced:
            return
        self.stats.bad_bytes += nbytes
        if not self._in_junk:
            self._in_junk = True
            self.stats.bad_data += 1

    def resync(self) -> None:
        """A new connection: drop any partial frame, uncounted, and count nothing until the first valid frame."""
        self._buf = b""
        self._synced = False
        self._in_junk = False

    def feed(self, data: bytes) -> list[Any]:
        buf = self._buf + data if self._buf else data
        out: list[Any] = []
        n = len(buf)
        i = 0
        table = _TABLE
        stats = self.stats
        check = self._check
        while i < n:
            b0 = buf[i]
            if b0 == MAGIC_V2:
                if n - i < 10:
                    break
                mlen = buf[i + 1]
                incompat = buf[i + 2]
                end = i + 12 + mlen + (13 if incompat & SIGNED else 0)
                if end > n:
                    break
                msgid = buf[i + 7] | (buf[i + 8] << 8) | (buf[i + 9] << 16)
                info = table.get(msgid)
                if info is None:
                    # Unknown id: cannot check the CRC, so do not trust the length either.
                    stats.unknown += 1
                    self._junk(1)
                    i += 1
                    continue
                body_end = i + 10 + mlen
                crc = buf[body_end] | (buf[body_end + 1] << 8)
                if _crc(bytes((info.crc_extra,)), _crc(buf[i + 1 : body_end])) != crc:
                    stats.crc_errors += 1
                    self._junk(1)
                    i += 1
                    continue
                self._synced, self._in_junk = True, False
                if check is not None and not check(buf[i:end], msgid):
                    stats.unverified += 1
                    i = end
                    continue
                light = info.light
                if light is not None:
                    payload = buf[i + 10 : body_end]
                    if mlen < info.size:
                        payload = payload + bytes(info.size - mlen)  # MAVLink 2 trims trailing zeros
                    elif mlen > info.size:
                        payload = payload[: info.size]
                    hdr = LightHeader(msgid, incompat, buf[i + 3], mlen, buf[i + 4], buf[i + 5], buf[i + 6])
                    out.append(light(hdr, crc, *info.unpack(payload)))
                else:
                    self._slow(buf[i:end], out)
                i = end
            elif b0 == MAGIC_V1:
                if n - i < 6:
                    break
                end = i + 8 + buf[i + 1]
                if end > n:
                    break
                info = table.get(buf[i + 5])
                if info is None:
                    stats.unknown += 1
                    self._junk(1)
                    i += 1
                    continue
                body_end = end - 2
                crc = buf[body_end] | (buf[body_end + 1] << 8)
                if _crc(bytes((info.crc_extra,)), _crc(buf[i + 1 : body_end])) != crc:
                    stats.crc_errors += 1
                    self._junk(1)
                    i += 1
                    continue
                self._synced, self._in_junk = True, False
                if check is not None and not check(buf[i:end], buf[i + 5]):
                    stats.unverified += 1
                    i = end
                    continue
                self._slow(buf[i:end], out)
                i = end
            else:
                # Skip to the next possible frame start in one step.
                j1 = buf.find(b"\xfd", i)
                j2 = buf.find(b"\xfe", i)
                j = min(x for x in (j1, j2, n) if x >= 0)
                self._junk(j - i)
                i = j
        self._buf = buf[i:] if i < n else b""
        if len(self._buf) > 300:  # cannot be one frame: drop the junk
            self._junk(len(self._buf))
            self._buf = b""
        return out

    def reset(self) -> None:
        """Drop a buffered partial frame (counted as one bad stretch); the counters carry on."""
        if self._buf:
            self._junk(len(self._buf))
        self._buf = b""

    def _slow(self, frame: bytes, out: list[Any]) -> None:
        """pymavlink's decode() for messages with arrays or strings; a frame it refuses is skipped bytes."""
        try:
            msg = self._mav.decode(bytearray(frame))
        except Exception:
            self._junk(len(frame))
            return
        out.append(msg)
