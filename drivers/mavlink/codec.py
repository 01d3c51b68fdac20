"""Sans-IO MAVLink framing and parsing.

`MavCodec.feed(bytes)` takes whatever a transport read (a partial frame, many
frames, garbage) and returns the complete, CRC-valid messages in it (framing
in `framer.py`, about twice pymavlink's parse rate). It keeps
per-peer sequence numbers to count gaps and counts CRC failures and skipped
garbage, so link quality is observable without any I/O in here.

With a `MavSigning` (drivers/mavlink/signing.py) it signs every frame it
encodes and drops received frames that are unsigned, badly signed or
replayed (counted in `stats.signing_rejected`) before they are decoded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from drivers.mavlink.dialect import MavMessage, mavlink2
from drivers.mavlink.framer import Framer
from drivers.mavlink.signing import MavSigning

# MAVLink component id of an onboard computer (MAV_COMP_ID_ONBOARD_COMPUTER).
GATEWAY_COMPONENT_ID = 191
GATEWAY_SYSTEM_ID = 245


@dataclass(slots=True)
class CodecStats:
    messages_in: int = 0
    crc_errors: int = 0
    bad_data: int = 0  # stretches of bytes that were not a valid frame (not bytes; see FramerStats)
    unknown: int = 0  # frame starts with a message id this dialect does not know
    seq_gaps: int = 0  # frames missing, summed over every peer
    by_type: dict[str, int] = field(default_factory=dict)
    # Frames dropped by signature verification, by reason (the signing state's
    # live dict; empty without signing).
    signing_rejected: dict[str, int] = field(default_factory=dict)


class MavCodec:
    """Decode MAVLink 2 (and 1) frames from a byte stream; encode outgoing messages."""

    def __init__(self, *, src_system: int = GATEWAY_SYSTEM_ID, src_component: int = GATEWAY_COMPONENT_ID,
                 signing: MavSigning | None = None) -> None:
        # pymavlink's object frames what we send and decodes, for the framer,
        # the messages its fast path does not cover.
        self._mav = mavlink2.MAVLink(None, srcSystem=src_system, srcComponent=src_component)
        self.stats = CodecStats()
        self.signing = signing
        if signing is None:
            self._framer = Framer(self._mav)
        else:
            # pymavlink checks signatures in decode() once its object holds a key
            # (and raises): the framer verifies, so decoding uses a key-less object.
            signing.attach(self._mav)
            self.stats.signing_rejected = signing.stats.rejected
            decoder = mavlink2.MAVLink(None, srcSystem=src_system, srcComponent=src_component)
            self._framer = Framer(decoder, check=signing.accepts)
        self._last_seq: dict[tuple[int, int], int] = {}

    @property
    def src_system(self) -> int:
        return int(self._mav.srcSystem)

    @property
    def src_component(self) -> int:
        return int(self._mav.srcComponent)

    def feed(self, data: bytes) -> list[MavMessage]:
        """Parse `data`; return the valid messages it completes, in order."""
        stats = self.stats
        framer = self._framer
        try:
            parsed = framer.feed(data)
        except Exception:  # never let a parser bug out of the codec: drop the buffer, count it
            framer.reset()
            framer.stats.bad_data += 1
            framer.stats.bad_bytes += len(data)
            parsed = []
        fs = framer.stats
        stats.crc_errors, stats.unknown, stats.bad_data = fs.crc_errors, fs.unknown, fs.bad_data
        if not parsed:
            return []
        by_type = stats.by_type
        last_seq = self._last_seq
        for msg in parsed:
            hdr = msg._header
            key = (hdr.srcSystem, hdr.srcComponent)
            prev = last_seq.get(key)
            seq = hdr.seq
            if prev is not None:
                gap = (seq - prev - 1) & 0xFF
                # A gap of 255 is a duplicate/reordered frame, not 255 losses.
                if 0 < gap < 128:
                    stats.seq_gaps += gap
            last_seq[key] = seq
            mtype = msg._type
            by_type[mtype] = by_type.get(mtype, 0) + 1
        stats.messages_in += len(parsed)
        return parsed

    def resync(self) -> None:
        """Call on every (re)connect: the stream starts mid-frame, so nothing is counted until a valid frame."""
        self._framer.resync()

    def encode(self, msg: MavMessage) -> bytes:
        """Frame one message with this codec's system/component ids and sequence (signed when signing is set)."""
        if self.signing is not None:
            self.signing.before_send()
        data: bytes = msg.pack(self._mav)
        self._mav.seq = (self._mav.seq + 1) % 256
        return data

    def encode_many(self, msgs: Sequence[MavMessage]) -> bytes:
        return b"".join(self.encode(m) for m in msgs)
