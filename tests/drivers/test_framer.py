"""The fast framer gives exactly what pymavlink's own parser gives."""

from __future__ import annotations

import random
from typing import Any

from mavjet.drivers.mavlink.codec import MavCodec
from mavjet.drivers.mavlink.dialect import mavlink2 as m
from mavjet.drivers.mavlink.framer import Framer
from tests.support.compiled import interpreted_only


def _mix(n: int) -> list[Any]:
    msgs: list[Any] = []
    for i in range(n):
        msgs += [
            m.MAVLink_global_position_int_message(i, int(47e7), int(8e7), 500000, 1000, 1, -2, 3, 9000),
            m.MAVLink_attitude_message(i, 0.1, -0.2, 0.3, 0, 0, 0),  # trailing zeros: a trimmed payload
            m.MAVLink_heartbeat_message(2, 3, 81, 4, 4, 3),
            m.MAVLink_statustext_message(4, b"hello world"),
            m.MAVLink_battery_status_message(0, 0, 0, 2500, [4000, 4000, 4000] + [65535] * 7, 100, 1000, 50, 80,
                                             0, 0, [0, 0, 0, 0], 0, 0),
            m.MAVLink_command_ack_message(400, 0, 0, 0, 245, 191),
        ]
    return msgs


def _reference(data: bytes) -> list[dict[str, Any]]:
    mav = m.MAVLink(None, 245, 191)
    mav.robust_parsing = True
    return [x.to_dict() for x in mav.parse_buffer(data) or [] if x._type != "BAD_DATA"]


def test_same_messages_as_pymavlink_in_any_chunking() -> None:
    enc = MavCodec(src_system=1, src_component=1)
    data = b"".join(enc.encode(x) for x in _mix(200))
    ref = _reference(data)
    assert len(ref) == 1200
    rng = random.Random(3)
    for _ in range(3):
        fr = Framer(m.MAVLink(None, 245, 191))
        got: list[Any] = []
        i = 0
        while i < len(data):
            k = rng.randint(1, 300)
            got += fr.feed(data[i : i + k])
            i += k
        assert [x.to_dict() for x in got] == ref
        assert [x._header.seq for x in got][:3] == [0, 1, 2]
        assert fr.stats.crc_errors == 0 and fr.stats.bad_data == 0


def test_mavlink1_and_signed_frames() -> None:
    mav1 = m.MAVLink(None, 7, 1)
    mav1.WIRE_PROTOCOL_VERSION = "1.0"
    v1 = m.MAVLink_heartbeat_message(2, 3, 0, 4, 4, 3).pack(mav1, force_mavlink1=True)
    signer = m.MAVLink(None, 8, 1)
    signer.signing.secret_key = bytes(range(32))
    signer.signing.link_id = 1
    signer.signing.sign_outgoing = True
    signed = m.MAVLink_attitude_message(5, 0.5, 0, 0, 0, 0, 0).pack(signer)
    fr = Framer(m.MAVLink(None, 245, 191))
    got = fr.feed(v1 + signed + v1)
    assert [x._type for x in got] == ["HEARTBEAT", "ATTITUDE", "HEARTBEAT"]
    assert got[0]._header.srcSystem == 7 and got[1]._header.srcSystem == 8
    assert got[1].roll == 0.5


def test_corruption_and_garbage_are_counted_and_skipped() -> None:
    enc = MavCodec(src_system=1, src_component=1)
    good = [enc.encode(x) for x in _mix(3)]
    bad = bytearray(good[0])
    bad[14] ^= 0x55
    rng = random.Random(9)
    junk = bytes(rng.randrange(256) for _ in range(400)).replace(b"\xfd", b"\x00").replace(b"\xfe", b"\x00")
    fr = Framer(m.MAVLink(None, 245, 191))
    got = fr.feed(bytes(bad) + junk + b"".join(good[1:]))
    assert len(got) == len(good) - 1
    # Bytes inside the broken frame can look like frame starts: at least one CRC error.
    # One broken stretch (the bad frame and the junk after it), counted once, not per byte.
    assert fr.stats.crc_errors >= 1 and fr.stats.bad_data == 1 and fr.stats.bad_bytes >= 400


def test_reset_drops_a_partial_frame_and_keeps_the_counters() -> None:
    enc = MavCodec(src_system=1, src_component=1)
    frame = enc.encode(m.MAVLink_attitude_message(1, 0.5, 0, 0, 0, 0, 0))
    fr = Framer(m.MAVLink(None, 245, 191))
    assert fr.feed(b"junk" + frame[:10]) == []
    assert (fr.stats.bad_data, fr.stats.bad_bytes) == (1, 4)  # counted in stretches, not bytes
    fr.reset()
    assert (fr.stats.bad_data, fr.stats.bad_bytes) == (1, 14)  # the 10 buffered bytes join the same stretch
    assert [x._type for x in fr.feed(frame)] == ["ATTITUDE"]  # nothing of the old partial frame left


@interpreted_only("mavjet.drivers.mavlink.framer")
def test_codec_survives_a_parser_failure_without_losing_counts(monkeypatch: Any) -> None:
    """A framer bug drops that buffer only: counters never go backwards and parsing goes on."""
    enc = MavCodec(src_system=1, src_component=1)
    frames = [enc.encode(x) for x in _mix(2)]
    codec = MavCodec()
    assert len(codec.feed(b"\x00" * 7 + frames[0])) == 1
    assert codec.stats.bad_data == 1  # one stretch of 7 bytes
    framer = codec._framer
    real_feed = framer.feed

    def broken(data: bytes) -> list[Any]:
        monkeypatch.setattr(framer, "feed", real_feed)  # fails once
        raise RuntimeError("parser bug")

    monkeypatch.setattr(framer, "feed", broken)
    assert codec.feed(frames[1]) == []
    assert codec.stats.bad_data == 2
    assert [x._type for x in codec.feed(b"".join(frames[2:]))] == [x._type for x in _mix(2)[2:]]
    assert codec.stats.bad_data == 2 and codec.stats.messages_in == 1 + len(frames) - 2


def test_resync_counts_nothing_for_the_partial_frame_at_connect() -> None:
    """A TCP connect starts mid-frame (and SITL prints a console banner): not link damage."""
    enc = MavCodec(src_system=1, src_component=1)
    frames = [enc.encode(x) for x in _mix(3)]
    codec = MavCodec()
    codec.resync()
    banner = b"Init ArduCopter V4.7.0-dev\nFree RAM: 524288\n" * 4  # 164-odd bytes, as SITL sends
    got = codec.feed(frames[0][5:] + banner + b"".join(frames[1:]))
    assert len(got) == len(frames) - 1 and codec.stats.bad_data == 0
    # once synced, a stretch of garbage counts once, however long
    codec.feed(b"\x00" * 50 + frames[0] + b"\x01" * 3)
    assert codec.stats.bad_data == 2


NEWEST = frozenset({m.MAVLINK_MSG_ID_ATTITUDE, m.MAVLINK_MSG_ID_GLOBAL_POSITION_INT})


def test_a_backlog_decodes_only_the_newest_of_each_newest_only_type() -> None:
    """A read holding several bursts (a reader that fell behind): older ATTITUDE and GLOBAL_POSITION_INT
    frames are counted and skipped, the newest of each is decoded as pymavlink decodes it, in its place."""
    enc = MavCodec(src_system=1, src_component=1)
    data = b"".join(enc.encode(x) for x in _mix(20))
    assert len(data) >= 512
    ref = _reference(data)
    fr = Framer(m.MAVLink(None, 245, 191))
    fr.newest_only = NEWEST
    got = [x.to_dict() for x in fr.feed(data)]
    last_att = max(i for i, r in enumerate(ref) if r["mavpackettype"] == "ATTITUDE")
    last_pos = max(i for i, r in enumerate(ref) if r["mavpackettype"] == "GLOBAL_POSITION_INT")
    expected = [r for i, r in enumerate(ref)
                if r["mavpackettype"] not in ("ATTITUDE", "GLOBAL_POSITION_INT") or i in (last_att, last_pos)]
    assert got == expected
    assert got[-6]["time_boot_ms"] == 19 and got[-5]["time_boot_ms"] == 19  # the newest samples
    # Counted as received, and as superseded: 19 of each type.
    assert fr.stats.messages == 120 and fr.stats.by_type["ATTITUDE"] == 20
    assert fr.stats.superseded == 38
    assert fr.stats.seq_gaps == 0 and fr.stats.crc_errors == 0


def test_newest_only_is_per_source_and_leaves_a_short_read_alone() -> None:
    a, b = MavCodec(src_system=1, src_component=1), MavCodec(src_system=2, src_component=1)
    att = [m.MAVLink_attitude_message(i, 0.1, 0.2, 0.3, 0.0, 0.0, 0.0) for i in range(12)]
    data = b"".join(a.encode(x) + b.encode(x) for x in att)
    assert len(data) >= 512
    fr = Framer(m.MAVLink(None, 245, 191))
    fr.newest_only = NEWEST
    got = fr.feed(data)
    assert [(x.get_srcSystem(), x.time_boot_ms) for x in got] == [(1, 11), (2, 11)]
    # One burst (~100 bytes, the usual read): everything decoded, nothing skipped.
    short = a.encode(att[0]) + a.encode(att[1])
    assert len(short) < 512
    assert [x.time_boot_ms for x in fr.feed(short)] == [0, 1]
    # The same backlog without the rule: every frame decoded.
    plain = Framer(m.MAVLink(None, 245, 191))
    assert len(plain.feed(data)) == 24 and plain.stats.superseded == 0
