"""A fast, sans-IO MAVLink frame scanner with its own decoders for messages without strings.

pymavlink's parser walks the buffer a byte at a time through several method
calls and re-checks everything in `decode()`; on this machine that is
~186k msgs/s for a core on the reference machine. Framing here slices whole frames out
of the buffer, unpacks the header with one `struct` call, checks the CRC
with fastcrc in one call and, for messages with no string fields (the whole
telemetry hot path: HEARTBEAT, GLOBAL_POSITION_INT, ATTITUDE, SYS_STATUS,
BATTERY_STATUS with its arrays, ...), unpacks the payload itself. Messages
with strings (STATUSTEXT, PARAM_VALUE, ...) are handed to pymavlink's own
`decode()`, which trims and decodes them.

Those messages come back as light objects (drivers/mavlink/light.py): the
same attribute names and value types as pymavlink's classes, at a fraction of
the construction cost. tests/drivers/test_fastdecode.py holds them to
pymavlink for every type.

A reader that fell behind hands over a backlog (a read of `NEWEST_ONLY_MIN_BYTES`
or more). For the message ids in `newest_only`, whose samples the caller keeps only
the newest of, every frame is still checked and counted, but only the newest per
source is decoded (`FramerStats.superseded` counts the rest).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastcrc import crc16

from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.drivers.mavlink.light import _TABLE, LightHeader, LightMessage

__all__ = ["MAGIC_V1", "MAGIC_V2", "NEWEST_ONLY_MIN_BYTES", "FrameCheck", "Framer", "FramerStats", "LightHeader",
           "LightMessage"]

MAGIC_V2 = 0xFD
MAGIC_V1 = 0xFE
SIGNED = mavlink2.MAVLINK_IFLAG_SIGNED
_crc = crc16.mcrf4xx
_ZEROS = tuple(bytes(n) for n in range(256))  # padding for trimmed payloads, one object per length
# A v2 header after the magic byte: length, incompat, compat, seq, system, component, msgid (16 + 8 bits).
_V2_HEADER = struct.Struct("<BBBBBBHB")
_v2_header = _V2_HEADER.unpack_from


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
    # Counted here, where the header is already unpacked, rather than in a second
    # pass over the messages: messages returned, by type, and frames missing
    # going by each peer's sequence numbers.
    messages: int = 0
    seq_gaps: int = 0
    # Frames of a `newest_only` type that a later one of the same type and source in the same
    # buffer replaced: counted (in `messages` and `by_type` too), CRC-checked, never decoded.
    superseded: int = 0
    by_type: dict[str, int] = field(default_factory=dict)


# Judges one complete, CRC-valid frame (bytes, message id): keep it or drop it.
FrameCheck = Callable[[bytes, int], bool]

# A buffer at least this long holds several bursts of a vehicle's telemetry: a reader that
# fell behind. Only then are `newest_only` frames skipped (a typical read is ~100 bytes,
# one burst, and pays nothing for the rule).
NEWEST_ONLY_MIN_BYTES = 512
_SKIPPED: Any = object()  # a superseded frame's place in `out`, removed before returning


class Framer:
    """Feed bytes, get pymavlink messages. Keeps an incomplete frame for the next feed."""

    def __init__(self, mav: Any, *, check: FrameCheck | None = None) -> None:
        self._mav = mav  # pymavlink MAVLink object, for decode() of messages with strings
        # Signature verification, only on links with a signing key: the unsigned
        # hot path pays one `is not None` test per frame and nothing else.
        self._check = check
        self._buf = b""
        self.stats = FramerStats()
        self._synced = True  # False until the first valid frame after resync()
        self._in_junk = False  # inside a stretch already counted in bad_data
        self._last_seq: dict[int, int] = {}  # (system << 8 | component) -> last sequence number
        # Message ids whose older frames in one long buffer are superseded by the newest (see
        # NEWEST_ONLY_MIN_BYTES): state samples that newest-wins would drop after decoding anyway.
        # Only messages without strings (decoded here) qualify; the owner sets it.
        self.newest_only: frozenset[int] = frozenset()

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
        last_seq = self._last_seq
        by_type = stats.by_type
        gaps = 0
        newest_only = self.newest_only if n >= NEWEST_ONLY_MIN_BYTES else None
        # (msgid, system, component) -> index in `out` of its newest frame, left undecoded until the end.
        newest: dict[int, int] = {}
        msg: Any
        while i < n:
            b0 = buf[i]
            if b0 == MAGIC_V2:
                if n - i < 10:
                    break
                hdr = _v2_header(buf, i + 1)
                mlen = hdr[0]
                end = i + 12 + mlen + (13 if hdr[1] & SIGNED else 0)
                if end > n:
                    break
                msgid = hdr[6] | (hdr[7] << 16)
                info = table.get(msgid)
                if info is None:
                    # Unknown id: cannot check the CRC, so do not trust the length either.
                    stats.unknown += 1
                    self._junk(1)
                    i += 1
                    continue
                extra, unpack, unpack_from, size, light, mtype = info
                body_end = i + 10 + mlen
                crc = buf[body_end] | (buf[body_end + 1] << 8)
                if _crc(extra, _crc(buf[i + 1 : body_end])) != crc:
                    stats.crc_errors += 1
                    self._junk(1)
                    i += 1
                    continue
                if not self._synced or self._in_junk:
                    self._synced, self._in_junk = True, False
                if check is not None and not check(buf[i:end], msgid):
                    stats.unverified += 1
                    i = end
                    continue
                if newest_only and msgid in newest_only and light is not None:
                    nkey = msgid << 16 | hdr[4] << 8 | hdr[5]
                    prev_at = newest.get(nkey)
                    if prev_at is not None:
                        out[prev_at] = _SKIPPED
                    newest[nkey] = len(out)
                    msg = (i, mlen, body_end, crc, hdr, info)  # decoded below if no later frame replaces it
                elif light is not None:
                    if mlen >= size:  # longer: fields of a newer dialect, ignored as pymavlink does
                        values = unpack_from(buf, i + 10)
                    else:  # MAVLink 2 trims trailing zeros
                        values = unpack(buf[i + 10 : body_end] + _ZEROS[size - mlen])
                    msg = light(LightHeader(hdr), crc, values)
                else:
                    msg = self._slow(buf[i:end])
                    i = end
                    if msg is None:
                        continue
                    mtype = msg.get_type()  # pymavlink's decode: rare (strings), a call is nothing here
                i = end
                out.append(msg)
                by_type[mtype] = by_type.get(mtype, 0) + 1
                key = hdr[4] << 8 | hdr[5]
                prev = last_seq.get(key)
                if prev is not None:
                    gap = (hdr[3] - prev - 1) & 0xFF
                    # A gap of 255 is a duplicate/reordered frame, not 255 losses.
                    if 0 < gap < 128:
                        gaps += gap
                last_seq[key] = hdr[3]
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
                if _crc(info[0], _crc(buf[i + 1 : body_end])) != crc:
                    stats.crc_errors += 1
                    self._junk(1)
                    i += 1
                    continue
                self._synced, self._in_junk = True, False
                if check is not None and not check(buf[i:end], buf[i + 5]):
                    stats.unverified += 1
                    i = end
                    continue
                seq, key = buf[i + 2], buf[i + 3] << 8 | buf[i + 4]
                msg = self._slow(buf[i:end])
                i = end
                if msg is None:
                    continue
                out.append(msg)
                mtype = msg.get_type()
                by_type[mtype] = by_type.get(mtype, 0) + 1
                prev = last_seq.get(key)
                if prev is not None:
                    gap = (seq - prev - 1) & 0xFF
                    if 0 < gap < 128:
                        gaps += gap
                last_seq[key] = seq
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
        if out:
            stats.messages += len(out)
            stats.seq_gaps += gaps
        if newest:
            out = self._decode_newest(buf, out, newest)
        return out

    def _decode_newest(self, buf: bytes, out: list[Any], newest: dict[int, int]) -> list[Any]:
        """Decode the frames `newest` points at, in place; drop the superseded ones.

        The decode is the hot loop's for a light frame, which `feed` writes out inline (a call
        per frame would cost every read); keep the two alike."""
        for at in newest.values():
            i, mlen, body_end, crc, hdr, info = out[at]
            _, unpack, unpack_from, size, light, _ = info
            values = unpack_from(buf, i + 10) if mlen >= size else unpack(buf[i + 10 : body_end] + _ZEROS[size - mlen])
            out[at] = light(LightHeader(hdr), crc, values)
        kept = [m for m in out if m is not _SKIPPED]
        self.stats.superseded += len(out) - len(kept)
        return kept

    def reset(self) -> None:
        """Drop a buffered partial frame (counted as one bad stretch); the counters carry on."""
        if self._buf:
            self._junk(len(self._buf))
        self._buf = b""

    def _slow(self, frame: bytes) -> Any:
        """pymavlink's decode() for messages with strings; a frame it refuses is skipped bytes (None)."""
        try:
            return self._mav.decode(bytearray(frame))
        except Exception:
            self._junk(len(frame))
            return None
