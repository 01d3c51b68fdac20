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

from mavjet.drivers.mavlink.dialect import MavMessage, mavlink2
from mavjet.drivers.mavlink.framer import Framer, FramerStats
from mavjet.drivers.mavlink.signing import MavSigning

# MAVLink component id of an onboard computer (MAV_COMP_ID_ONBOARD_COMPUTER).
GATEWAY_COMPONENT_ID = 191
GATEWAY_SYSTEM_ID = 245


class CodecStats:
    """The codec's counters: a live view of the framer's, which counts as it frames (no copy per read)."""

    __slots__ = ("_f", "signing_rejected")

    def __init__(self, framer: FramerStats) -> None:
        self._f = framer
        # Frames dropped by signature verification, by reason (the signing state's
        # live dict; empty without signing).
        self.signing_rejected: dict[str, int] = {}

    @property
    def messages_in(self) -> int:
        return self._f.messages

    @property
    def crc_errors(self) -> int:
        return self._f.crc_errors

    @property
    def bad_data(self) -> int:
        """Stretches of bytes that were not a valid frame (not bytes; see FramerStats)."""
        return self._f.bad_data

    @property
    def unknown(self) -> int:
        """Frame starts with a message id this dialect does not know."""
        return self._f.unknown

    @property
    def seq_gaps(self) -> int:
        """Frames missing, summed over every peer."""
        return self._f.seq_gaps

    @property
    def by_type(self) -> dict[str, int]:
        return self._f.by_type

    @property
    def superseded(self) -> int:
        """Frames of a `newest_only` type skipped undecoded because a newer one came in the same read."""
        return self._f.superseded

    def __repr__(self) -> str:
        return (f"CodecStats(messages_in={self.messages_in}, crc_errors={self.crc_errors}, bad_data={self.bad_data}, "
                f"unknown={self.unknown}, seq_gaps={self.seq_gaps}, signing_rejected={self.signing_rejected})")


class ConstantMessage:
    """A message whose fields never change (the gateway's heartbeat), framed once per sequence number.

    Every link sends the gateway's HEARTBEAT each second; pymavlink packs one
    in a few microseconds, about 2 % of the gateway's CPU at a thousand
    vehicles. Without signing, two sends of it from the same ids differ only
    in the sequence byte (and so the CRC), so `MavCodec.encode_constant`
    keeps each frame pymavlink made, by (system, component, sequence), and
    hands it out again: at most 256 frames, shared by every link. Signed
    frames carry a timestamp and are always packed afresh.
    """

    __slots__ = ("frames", "msg")

    def __init__(self, msg: MavMessage) -> None:
        self.msg = msg
        self.frames: dict[tuple[int, int, int], bytes] = {}


class MavCodec:
    """Decode MAVLink 2 (and 1) frames from a byte stream; encode outgoing messages."""

    def __init__(self, *, src_system: int = GATEWAY_SYSTEM_ID, src_component: int = GATEWAY_COMPONENT_ID,
                 signing: MavSigning | None = None) -> None:
        # pymavlink's object frames what we send and decodes, for the framer,
        # the messages its fast path does not cover.
        self._mav = mavlink2.MAVLink(None, srcSystem=src_system, srcComponent=src_component)
        self.signing = signing
        if signing is None:
            self._framer = Framer(self._mav)
        else:
            # pymavlink checks signatures in decode() once its object holds a key
            # (and raises): the framer verifies, so decoding uses a key-less object.
            signing.attach(self._mav)
            decoder = mavlink2.MAVLink(None, srcSystem=src_system, srcComponent=src_component)
            self._framer = Framer(decoder, check=signing.accepts)
        self.stats = CodecStats(self._framer.stats)
        if signing is not None:
            self.stats.signing_rejected = signing.stats.rejected

    @property
    def src_system(self) -> int:
        return int(self._mav.srcSystem)

    @property
    def src_component(self) -> int:
        return int(self._mav.srcComponent)

    def feed(self, data: bytes) -> list[MavMessage]:
        """Parse `data`; return the valid messages it completes, in order."""
        framer = self._framer
        try:
            return framer.feed(data)
        except Exception:  # never let a parser bug out of the codec: drop the buffer, count it
            framer.reset()
            framer.stats.bad_data += 1
            framer.stats.bad_bytes += len(data)
            return []

    @property
    def newest_only(self) -> frozenset[int]:
        """Message ids of which only the newest frame per source is decoded when a read holds a backlog
        (drivers/mavlink/framer.py, NEWEST_ONLY_MIN_BYTES): what a reader that fell behind can skip."""
        return self._framer.newest_only

    @newest_only.setter
    def newest_only(self, ids: frozenset[int]) -> None:
        self._framer.newest_only = ids

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

    def encode_constant(self, const: ConstantMessage) -> bytes:
        """`encode(const.msg)`, byte for byte, without packing it again (see ConstantMessage)."""
        if self.signing is not None:
            return self.encode(const.msg)
        mav = self._mav
        key = (mav.srcSystem, mav.srcComponent, mav.seq)
        data = const.frames.get(key)
        if data is None:
            data = const.frames[key] = const.msg.pack(mav)
        mav.seq = (mav.seq + 1) % 256
        return data

    def encode_many(self, msgs: Sequence[MavMessage]) -> bytes:
        return b"".join(self.encode(m) for m in msgs)
