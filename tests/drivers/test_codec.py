"""Sans-IO codec: bytes in, messages and counters out."""

from __future__ import annotations

import random

from mavjet.drivers.mavlink.codec import ConstantMessage, MavCodec
from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.drivers.mavlink.signing import MavSigning


def _heartbeat() -> object:
    return mavlink2.MAVLink_heartbeat_message(2, 3, 0, 4, 4, 3)


def _stream(n: int, codec: MavCodec | None = None) -> bytes:
    enc = codec or MavCodec(src_system=1, src_component=1)
    out = bytearray()
    for i in range(n):
        out += enc.encode(mavlink2.MAVLink_attitude_message(i, 0.1, 0.2, 0.3, 0, 0, 0))
    return bytes(out)


def test_partial_frames_are_reassembled() -> None:
    data = _stream(3)
    dec = MavCodec()
    got = []
    for i in range(len(data)):
        got += dec.feed(data[i : i + 1])
    assert [m.time_boot_ms for m in got] == [0, 1, 2]
    assert dec.stats.messages_in == 3 and dec.stats.by_type == {"ATTITUDE": 3}


def test_crc_error_counted_and_parsing_continues() -> None:
    enc = MavCodec(src_system=1, src_component=1)
    good1 = enc.encode(_heartbeat())
    bad = bytearray(enc.encode(_heartbeat()))
    bad[12] ^= 0xFF  # payload byte: CRC no longer matches
    good2 = enc.encode(_heartbeat())
    dec = MavCodec()
    msgs = dec.feed(good1 + bytes(bad) + good2)
    assert len(msgs) == 2
    assert dec.stats.crc_errors == 1


def test_garbage_is_skipped_never_raised() -> None:
    rng = random.Random(7)
    garbage = bytes(rng.randrange(256) for _ in range(5000))
    dec = MavCodec()
    dec.feed(garbage)
    after = dec.feed(_stream(5))
    # Random bytes can contain a valid-looking start marker that swallows the
    # start of the next frame, so at least 4 of the 5 real frames survive.
    assert len(after) >= 4
    assert dec.stats.bad_data + dec.stats.crc_errors + dec.stats.unknown > 0


def test_sequence_gaps_counted_per_peer() -> None:
    enc = MavCodec(src_system=1, src_component=1)
    frames = [enc.encode(mavlink2.MAVLink_attitude_message(i, 0, 0, 0, 0, 0, 0)) for i in range(10)]
    dec = MavCodec()
    dec.feed(b"".join(frames[:3] + frames[6:]))  # frames 3, 4, 5 lost
    assert dec.stats.seq_gaps == 3
    other = MavCodec(src_system=2, src_component=1)
    dec.feed(other.encode(_heartbeat()))  # a new peer starts its own count
    assert dec.stats.seq_gaps == 3


def test_sequence_wraps_without_a_gap() -> None:
    enc = MavCodec(src_system=1, src_component=1)
    data = b"".join(enc.encode(_heartbeat()) for _ in range(300))
    dec = MavCodec()
    assert len(dec.feed(data)) == 300
    assert dec.stats.seq_gaps == 0


def test_encode_uses_our_ids() -> None:
    enc = MavCodec(src_system=245, src_component=191)
    msg = MavCodec().feed(enc.encode(_heartbeat()))[0]
    assert (msg.get_srcSystem(), msg.get_srcComponent()) == (245, 191)


def test_constant_frames_equal_pymavlinks_for_every_sequence() -> None:
    """The cached heartbeat is the frame `encode` makes, for each sequence number and for other ids."""
    const = ConstantMessage(_heartbeat())  # type: ignore[arg-type]
    for ids in ((245, 191), (1, 1)):
        cached, packed = MavCodec(src_system=ids[0], src_component=ids[1]), MavCodec(src_system=ids[0], src_component=ids[1])
        for _ in range(300):  # past the wrap of the sequence byte, so half the frames come from the cache
            assert cached.encode_constant(const) == packed.encode(_heartbeat())  # type: ignore[arg-type]
    assert len(const.frames) == 512
    # Sequence numbers still advance across both kinds of send.
    enc, dec = MavCodec(src_system=7, src_component=1), MavCodec()
    data = enc.encode_constant(const) + enc.encode(_heartbeat()) + enc.encode_constant(const)  # type: ignore[arg-type]
    assert [m.get_seq() for m in dec.feed(data)] == [0, 1, 2]
    assert dec.stats.seq_gaps == 0


def test_constant_frames_are_signed_afresh() -> None:
    const = ConstantMessage(_heartbeat())  # type: ignore[arg-type]
    enc = MavCodec(src_system=7, src_component=1, signing=MavSigning(b"k" * 32))
    a, b = enc.encode_constant(const), enc.encode_constant(const)
    assert a[0] == b[0] == 0xFD and a[2] & 0x01  # MAVLink 2, the signed flag set
    assert a[4] != b[4] and not const.frames  # each its own sequence and signature; nothing cached
