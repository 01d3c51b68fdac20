"""The framer's own decoders (light messages) against pymavlink, the reference.

Fed with frames a real ArduCopter sent (tests/drivers/fixtures/ardupilot_frames.json)
and with every message type of the dialect that the framer decodes itself,
filled with random values, trailing zeros (trimmed on the wire) included.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

from mavjet.drivers.mavlink.codec import MavCodec
from mavjet.drivers.mavlink.dialect import mavlink2 as m
from mavjet.drivers.mavlink.framer import Framer
from mavjet.drivers.mavlink.light import _TABLE, LightMessage

FRAMES = [bytes.fromhex(h) for h in
          json.loads((Path(__file__).parent / "fixtures" / "ardupilot_frames.json").read_text())["frames"]]
HEADER_FIELDS = ("msgId", "incompat_flags", "compat_flags", "mlen", "seq", "srcSystem", "srcComponent")


def _reference(data: bytes) -> list[Any]:
    mav = m.MAVLink(None, 245, 191)
    mav.robust_parsing = True
    return [x for x in mav.parse_buffer(data) or [] if x._type != "BAD_DATA"]


def _nan_safe(v: Any) -> Any:
    """NaN is on the wire (ArduPilot sends it for "unused"), and NaN != NaN: compare it as a marker."""
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    if isinstance(v, list):
        return [_nan_safe(x) for x in v]
    if isinstance(v, dict):
        return {k: _nan_safe(x) for k, x in v.items()}
    return v


def _same(got: list[Any], ref: list[Any]) -> None:
    assert [x.get_type() for x in got] == [x.get_type() for x in ref]
    for a, b in zip(got, ref, strict=True):
        assert _nan_safe(a.to_dict()) == _nan_safe(b.to_dict())
        assert [getattr(a._header, f) for f in HEADER_FIELDS] == [getattr(b._header, f) for f in HEADER_FIELDS]
        assert (a.get_srcSystem(), a.get_srcComponent(), a.get_seq(), a.get_msgId()) == \
               (b.get_srcSystem(), b.get_srcComponent(), b.get_seq(), b.get_msgId())
        for name in b.get_fieldnames():
            assert _nan_safe(getattr(a, name)) == _nan_safe(getattr(b, name)), (b.get_type(), name)
            assert type(getattr(a, name)) is type(getattr(b, name)), (b.get_type(), name)


def test_recorded_ardupilot_frames_decode_as_pymavlink_does() -> None:
    data = b"".join(FRAMES)
    ref = _reference(data)
    assert len(ref) == len(FRAMES)
    types = {x.get_type() for x in ref}
    assert {"HEARTBEAT", "GLOBAL_POSITION_INT", "SYS_STATUS", "EXTENDED_SYS_STATE", "HOME_POSITION"} <= types
    assert any(x._header.incompat_flags & 1 for x in ref)  # signed frames are among them
    rng = random.Random(11)
    for chunk_max in (1, 7, 64, len(data)):
        fr = Framer(m.MAVLink(None, 245, 191))
        got: list[Any] = []
        i = 0
        while i < len(data):
            k = rng.randint(1, chunk_max)
            got += fr.feed(data[i : i + k])
            i += k
        _same(got, ref)
        assert (fr.stats.crc_errors, fr.stats.bad_data, fr.stats.unknown) == (0, 0, 0)
    light = {x.get_type() for x in Framer(m.MAVLink(None)).feed(data) if isinstance(x, LightMessage)}
    assert {"HEARTBEAT", "GLOBAL_POSITION_INT", "SYS_STATUS", "HOME_POSITION", "AUTOPILOT_VERSION"} <= light


def _random_value(rng: random.Random, ftype: str, zero: bool) -> Any:
    if zero:
        return 0.0 if ftype in ("float", "double") else 0
    if ftype == "float":
        return rng.choice((rng.uniform(-1e6, 1e6), 0.5, -0.0))
    if ftype == "double":
        return rng.uniform(-1e12, 1e12)
    bits = int("".join(c for c in ftype if c.isdigit()))
    if ftype.startswith("u"):
        return rng.randrange(0, 1 << bits)
    return rng.randrange(-(1 << (bits - 1)), 1 << (bits - 1))


def _random_message(cls: Any, rng: random.Random) -> Any:
    names = list(cls.fieldnames)
    # Zero the last wire fields now and then: MAVLink 2 trims trailing zeros.
    wire = list(cls.ordered_fieldnames)
    zero_from = rng.choice((len(wire), len(wire), max(0, len(wire) - 2), len(wire) // 2))
    zeroed = set(wire[zero_from:])
    values = []
    length = dict(zip(wire, cls.array_lengths, strict=True))  # array lengths are in wire order, types in field order
    for name, ftype in zip(names, cls.fieldtypes, strict=True):
        n = length[name]
        z = name in zeroed
        values.append([_random_value(rng, ftype, z) for _ in range(n)] if n else _random_value(rng, ftype, z))
    return cls(*values)


LIGHT_TYPES = sorted((info[5], msgid) for msgid, info in _TABLE.items() if info[4] is not None)


def test_most_of_the_dialect_is_decoded_light() -> None:
    assert len(LIGHT_TYPES) > 0.8 * len(_TABLE)
    names = {name for name, _ in LIGHT_TYPES}
    assert {"HEARTBEAT", "GLOBAL_POSITION_INT", "ATTITUDE", "SYS_STATUS", "GPS_RAW_INT", "VFR_HUD", "BATTERY_STATUS",
            "EXTENDED_SYS_STATE", "SYSTEM_TIME", "HOME_POSITION", "COMMAND_ACK"} <= names
    assert "STATUSTEXT" not in names and "PARAM_VALUE" not in names  # strings: pymavlink's decode()


@pytest.mark.parametrize("seed", [1, 2])
def test_every_light_type_with_random_values(seed: int) -> None:
    rng = random.Random(seed)
    enc = MavCodec(src_system=rng.randrange(1, 255), src_component=rng.randrange(0, 255))
    data = b"".join(enc.encode(_random_message(m.mavlink_map[msgid], rng)) for _, msgid in LIGHT_TYPES)
    ref = _reference(data)
    assert len(ref) == len(LIGHT_TYPES)
    got = Framer(m.MAVLink(None, 245, 191)).feed(data)
    assert all(isinstance(x, LightMessage) for x in got)
    _same(got, ref)


def test_codec_counts_types_messages_and_gaps_in_its_one_pass() -> None:
    codec = MavCodec()
    data = b"".join(FRAMES)
    got = codec.feed(data)
    counts: dict[str, int] = {}
    for x in _reference(data):
        counts[x.get_type()] = counts.get(x.get_type(), 0) + 1
    assert codec.stats.by_type == counts and codec.stats.messages_in == len(got) == len(FRAMES)
    # The recording skips frames (only some of each type were kept): the gaps are counted.
    assert codec.stats.seq_gaps > 0


def test_a_longer_payload_than_the_dialect_knows_is_cut_as_pymavlink_cuts_it() -> None:
    """A newer autopilot's extension fields: the known prefix is decoded, the rest ignored."""
    from fastcrc import crc16

    msg = m.MAVLink_attitude_message(7, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6)
    frame = bytearray(MavCodec(src_system=3, src_component=1).encode(msg))
    body = frame[10:-2] + b"\x01\x02\x03"
    frame = bytearray(frame[:10] + body)
    frame[1] = len(body)
    crc = crc16.mcrf4xx(bytes((m.MAVLink_attitude_message.crc_extra,)), crc16.mcrf4xx(bytes(frame[1:])))
    data = bytes(frame) + crc.to_bytes(2, "little")
    got = Framer(m.MAVLink(None, 245, 191)).feed(data)
    _same(got, _reference(data))
    assert got[0].yawspeed == pytest.approx(0.6)
