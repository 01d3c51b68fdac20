"""MAVLink 2 signing (drivers/mavlink/signing.py) against frames recorded from a real ArduCopter.

The fixture holds a few frames of an ArduCopter SITL session signed with the
key 0x01..0x20 (see its "about"): the vehicle's signed frames on two links,
and a ground station's unsigned, wrong-key, right-key and replayed requests.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mavjet.contract.errors import ConfigError
from mavjet.drivers.mavlink.codec import MavCodec
from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.drivers.mavlink.signing import (
    EPOCH_2015_S,
    TICKS_PER_S,
    MavSigning,
    Verdict,
    parse_key,
    setup_signing_message,
    signature_fields,
    timestamp_ticks,
)

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "signing_frames.json").read_text())
KEY = bytes.fromhex(FIXTURE["key_hex"])


def _frame(hex_: str) -> bytes:
    return bytes.fromhex(hex_)


def _msgid(frame: bytes) -> int:
    return frame[7] | frame[8] << 8 | frame[9] << 16


def _recording_clock() -> float:
    """Wall time of the recording: the setup's initial_timestamp (so no stream is stale)."""
    setup = mavlink2.MAVLink(None).decode(bytearray(_frame(FIXTURE["setup_signing"])))
    return float(EPOCH_2015_S + setup.initial_timestamp / TICKS_PER_S)


def _signing(key: bytes = KEY) -> MavSigning:
    wall = _recording_clock()
    return MavSigning(key, clock=lambda: wall)


def test_every_recorded_vehicle_frame_verifies_on_both_links() -> None:
    s = _signing()
    for name, link_id in (("vehicle_signed_link0", 0), ("vehicle_signed_link1", 1)):
        for h in FIXTURE[name]:
            f = _frame(h)
            assert s.verify(f, _msgid(f)) is Verdict.OK, name
            assert signature_fields(f)[0] == link_id
    assert s.stats.accepted == len(FIXTURE["vehicle_signed_link0"]) + len(FIXTURE["vehicle_signed_link1"])
    assert s.stats.rejected == {}


def test_wrong_key_unsigned_and_replay_are_refused_like_arducopter_serial1() -> None:
    s = _signing()
    cases = [
        ("gcs_unsigned_link1_request", Verdict.UNSIGNED),  # ArduCopter: no reply
        ("gcs_wrong_key_link1_request", Verdict.BAD_SIGNATURE),  # no reply
        ("gcs_right_key_link1_request", Verdict.OK),  # COMMAND_ACK + AUTOPILOT_VERSION
        ("gcs_replay_link1_request", Verdict.REPLAY),  # byte-exact replay: no reply
    ]
    for name, expected in cases:
        f = _frame(FIXTURE[name])
        assert s.verify(f, _msgid(f)) is expected, name
    assert s.stats.rejected == {"unsigned": 1, "bad_signature": 1, "replay": 1}


def test_a_forged_frame_does_not_advance_the_stream() -> None:
    """A bad signature with a far-future timestamp must not block the genuine stream (pymavlink's check would)."""
    s = _signing()
    good = _frame(FIXTURE["vehicle_signed_link0"][0])
    forged = bytearray(good)
    forged[-12:-6] = (2**48 - 1).to_bytes(6, "little")
    assert s.verify(bytes(forged), 0) is Verdict.BAD_SIGNATURE
    assert s.verify(good, 0) is Verdict.OK


def test_a_new_stream_more_than_a_minute_behind_is_stale() -> None:
    f = _frame(FIXTURE["gcs_right_key_link1_request"])
    _, ts = signature_fields(f)
    late = EPOCH_2015_S + ts / TICKS_PER_S + 61.0
    assert MavSigning(KEY, clock=lambda: late).verify(f, _msgid(f)) is Verdict.STALE
    in_time = EPOCH_2015_S + ts / TICKS_PER_S + 59.0
    assert MavSigning(KEY, clock=lambda: in_time).verify(f, _msgid(f)) is Verdict.OK


def test_radio_status_may_come_unsigned() -> None:
    s = _signing()
    frame = mavlink2.MAVLink_radio_status_message(200, 190, 50, 230, 60, 0, 0).pack(mavlink2.MAVLink(None, 51, 68))
    assert s.verify(bytes(frame), mavlink2.MAVLINK_MSG_ID_RADIO_STATUS) is Verdict.UNSIGNED_ALLOWED
    assert s.stats.rejected == {}


def test_signing_reproduces_the_recorded_signed_request_byte_for_byte() -> None:
    recorded = _frame(FIXTURE["gcs_signed_link0_request"])
    msg = mavlink2.MAVLink(None).decode(bytearray(recorded))
    link_id, ts = signature_fields(recorded)
    wall = EPOCH_2015_S + ts / TICKS_PER_S
    codec = MavCodec(src_system=255, src_component=190, signing=MavSigning(KEY, link_id=link_id, clock=lambda: wall))
    codec._mav.seq = recorded[4]
    codec.signing.timestamp = ts  # type: ignore[union-attr]
    codec._mav.signing.timestamp = ts
    assert codec.encode(msg) == recorded


def test_outgoing_timestamps_follow_the_clock_and_increase() -> None:
    now = [1_800_000_000.0]
    codec = MavCodec(signing=MavSigning(KEY, clock=lambda: now[0]))
    hb = mavlink2.MAVLink_heartbeat_message(18, 8, 0, 0, 4, 3)
    stamps = [signature_fields(codec.encode(hb))[1] for _ in range(3)]
    assert stamps == [timestamp_ticks(now[0]) + i for i in range(3)]
    now[0] -= 10.0  # the clock steps back: timestamps still increase
    assert signature_fields(codec.encode(hb))[1] == stamps[-1] + 1
    now[0] += 100.0
    assert signature_fields(codec.encode(hb))[1] == timestamp_ticks(now[0])


def test_accepted_peer_timestamp_ahead_of_ours_moves_ours_forward() -> None:
    """ArduPilot signs 60 s ahead of its initial_timestamp; what we send must not look stale to it."""
    wall = _recording_clock()
    codec = MavCodec(signing=MavSigning(KEY, clock=lambda: wall))
    f = _frame(FIXTURE["vehicle_signed_link0"][-1])
    assert codec.feed(f)
    _, vehicle_ts = signature_fields(f)
    out = codec.encode(mavlink2.MAVLink_heartbeat_message(18, 8, 0, 0, 4, 3))
    assert signature_fields(out)[1] >= vehicle_ts


def test_codec_with_a_key_drops_unsigned_and_bad_frames_and_counts_them() -> None:
    codec = MavCodec(signing=_signing())
    stream = b"".join(_frame(h) for h in [
        *FIXTURE["vehicle_unsigned_link0"],  # before SETUP_SIGNING: unsigned
        *FIXTURE["vehicle_signed_link0"],
        FIXTURE["vehicle_signed_link0"][0],  # replay
    ])
    msgs = codec.feed(stream)
    assert [m.get_type() for m in msgs] == [
        "HEARTBEAT", "PARAM_VALUE", "HEARTBEAT", "STATUSTEXT", "STATUSTEXT", "COMMAND_ACK", "AUTOPILOT_VERSION",
    ]
    assert codec.stats.signing_rejected == {"unsigned": 2, "replay": 1}
    assert codec.stats.crc_errors == 0 and codec.stats.bad_data == 0


def test_codec_with_a_wrong_key_decodes_nothing() -> None:
    codec = MavCodec(signing=_signing(bytes(32 * [7])))
    assert codec.feed(b"".join(_frame(h) for h in FIXTURE["vehicle_signed_link0"])) == []
    assert codec.stats.signing_rejected == {"bad_signature": len(FIXTURE["vehicle_signed_link0"])}


def test_codec_without_a_key_still_reads_signed_frames() -> None:
    msgs = MavCodec().feed(b"".join(_frame(h) for h in FIXTURE["vehicle_signed_link0"]))
    assert len(msgs) == len(FIXTURE["vehicle_signed_link0"])
    assert msgs[-1].get_type() == "AUTOPILOT_VERSION" and msgs[-1].flight_sw_version == 0x04070000


def test_setup_signing_message_matches_the_recorded_one() -> None:
    recorded: Any = mavlink2.MAVLink(None).decode(bytearray(_frame(FIXTURE["setup_signing"])))
    wall = EPOCH_2015_S + recorded.initial_timestamp / TICKS_PER_S
    msg = setup_signing_message(KEY, target_system=1, target_component=1, wall_s=wall)
    assert bytes(msg.secret_key) == bytes(recorded.secret_key) == KEY
    assert abs(msg.initial_timestamp - recorded.initial_timestamp) <= 1
    off = setup_signing_message(bytes(32), target_system=1, target_component=1, wall_s=wall)
    assert off.initial_timestamp == 0


@pytest.mark.parametrize("content", [KEY.hex().encode(), KEY.hex().upper().encode() + b"\n", KEY])
def test_parse_key_takes_hex_or_raw(content: bytes) -> None:
    assert parse_key(content) == KEY


@pytest.mark.parametrize("content", [b"", b"abc", KEY[:31], b"zz" * 32])
def test_parse_key_refuses_anything_else(content: bytes) -> None:
    with pytest.raises(ConfigError):
        parse_key(content)
