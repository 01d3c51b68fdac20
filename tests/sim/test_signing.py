"""The simulator signs like ArduCopter (sim/signing.py), checked against frames recorded from the real one.

Recorded (tests/drivers/fixtures/signing_frames.json, key 0x01..0x20): after an
unsigned SETUP_SIGNING on SERIAL0 every vehicle frame is signed, link_id 0 on
SERIAL0 and 1 on SERIAL1, the first with initial_timestamp + 6,000,000, then +1
per frame; on SERIAL1 unsigned, wrong-key and replayed requests get no answer,
a correctly signed one does; on SERIAL0 an unsigned request is still answered.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from pymavlink.dialects.v20 import ardupilotmega as M

from mavjet.sim.fleet import SimFleet
from mavjet.sim.signing import AHEAD_TICKS, Check, VehicleSigning
from tests.support.sim import MavClient
from tests.support.wait import wait_for

FIXTURE = json.loads((Path(__file__).parents[1] / "drivers" / "fixtures" / "signing_frames.json").read_text())
KEY = bytes.fromhex(FIXTURE["key_hex"])
EPOCH_2015_S = 1_420_070_400
AUTOPILOT_VERSION = M.MAVLINK_MSG_ID_AUTOPILOT_VERSION


def _f(h: str) -> bytes:
    return bytes.fromhex(h)


def _recorded_setup() -> Any:
    return M.MAVLink(None).decode(bytearray(_f(FIXTURE["setup_signing"])))


def _unsigned(frame: bytes) -> bytes:
    out = bytearray(frame[:-13])
    out[2] &= 0xFE
    return bytes(out)  # CRC left stale on purpose: sign() recomputes it


def _now_ticks() -> int:
    return int((time.time() - EPOCH_2015_S) * 100_000)


def _sig_ok(frame: bytes, key: bytes = KEY) -> bool:
    return bool(frame[2] & 1) and hashlib.sha256(key + frame[:-6]).digest()[:6] == frame[-6:]


# -- sans-IO, against the recording ----------------------------------------------------------

def test_first_signed_frame_is_byte_identical_to_arducopter() -> None:
    setup = _recorded_setup()
    s = VehicleSigning()
    s.setup(bytes(setup.secret_key), setup.initial_timestamp)
    recorded = _f(FIXTURE["vehicle_first_signed_link0"])
    assert s.sign(_unsigned(recorded), 0) == recorded
    assert s.link_ts[0] == setup.initial_timestamp + AHEAD_TICKS + 1


def test_recorded_serial1_requests_get_arducopters_verdicts() -> None:
    setup = _recorded_setup()
    s = VehicleSigning()
    s.setup(bytes(setup.secret_key), setup.initial_timestamp)
    got = [s.check(_f(FIXTURE[n]), 76, link_id=1) for n in (
        "gcs_unsigned_link1_request", "gcs_wrong_key_link1_request", "gcs_right_key_link1_request",
        "gcs_replay_link1_request",
    )]
    assert got == [Check.UNSIGNED, Check.BAD_SIGNATURE, Check.SIGNED, Check.REPLAY]
    assert s.counters.ignored == {"unsigned": 1, "bad_signature": 1, "replay": 1}


def test_serial0_accepts_unsigned_and_bad_frames_like_arducopter() -> None:
    setup = _recorded_setup()
    s = VehicleSigning()
    s.setup(bytes(setup.secret_key), setup.initial_timestamp)
    assert s.check(_f(FIXTURE["gcs_unsigned_link1_request"]), 76, link_id=0) is Check.ACCEPTED_UNSIGNED
    assert s.check(_f(FIXTURE["gcs_wrong_key_link1_request"]), 76, link_id=0) is Check.ACCEPTED_UNSIGNED
    assert s.check(_f(FIXTURE["gcs_signed_link0_request"]), 76, link_id=0) is Check.SIGNED


def test_all_zero_setup_turns_signing_off_and_reboot_keeps_key_a_minute_ahead() -> None:
    s = VehicleSigning()
    s.setup(KEY, 1000)
    s.sign(_unsigned(_f(FIXTURE["vehicle_first_signed_link0"])), 0)
    s.rebooted()
    assert s.enabled and s.link_ts == {}
    frame = s.sign(_unsigned(_f(FIXTURE["vehicle_first_signed_link0"])), 0)
    assert int.from_bytes(frame[-12:-6], "little") == 1000 + 2 * AHEAD_TICKS + 1
    s.setup(bytes(32), 0)
    assert not s.enabled


# -- over TCP --------------------------------------------------------------------------------

def _signer(link_id: int, compid: int) -> Any:
    mav = M.MAVLink(None, 255, compid)
    mav.signing.secret_key = KEY
    mav.signing.link_id = link_id
    mav.signing.sign_outgoing = True
    mav.signing.timestamp = _now_ticks()
    return mav


def _request(target: int) -> Any:
    return M.MAVLink_command_long_message(target, 1, M.MAV_CMD_REQUEST_MESSAGE, 0, AUTOPILOT_VERSION, 0, 0, 0, 0, 0, 0)


async def _answered(client: MavClient, data: bytes, *, timeout_s: float) -> bool:
    i = client.mark()
    client.writer.write(data)
    try:
        await client.recv("COMMAND_ACK", lambda a: a.command == M.MAV_CMD_REQUEST_MESSAGE, since=i, timeout_s=timeout_s)
    except TimeoutError:
        return False
    return True


async def test_setup_signing_then_links_sign_and_serial1_ignores_bad_frames(fleet: SimFleet, gcs: MavClient) -> None:
    v = fleet.vehicles[0]
    serial1 = await MavClient.connect(await v.listen_serial(1), compid=191)
    try:
        await gcs.recv("HEARTBEAT")
        initial = _now_ticks()
        i0, i1 = gcs.mark(), serial1.mark()
        gcs.send(M.MAVLink_setup_signing_message(v.sysid, 1, KEY, initial))  # unsigned, on SERIAL0
        hb0 = await gcs.recv("HEARTBEAT", since=i0)
        hb1 = await serial1.recv("HEARTBEAT", since=i1)
        for msg, link_id in ((hb0, 0), (hb1, 1)):
            frame = bytes(msg.get_msgbuf())
            assert _sig_ok(frame) and frame[-13] == link_id
            assert int.from_bytes(frame[-12:-6], "little") >= initial + AHEAD_TICKS
        assert not gcs.of("COMMAND_ACK", i0)  # accepted silently

        # SERIAL0 still answers unsigned requests (ArduPilot's channel 0 accepts anything).
        assert await _answered(gcs, _request(v.sysid).pack(gcs.mav), timeout_s=2.0)

        # SERIAL1: unsigned, wrong key: ignored; right key: answered; its byte-exact replay: ignored.
        unsigned = _request(v.sysid).pack(M.MAVLink(None, 255, 191))
        assert not await _answered(serial1, unsigned, timeout_s=0.5)
        wrong = _signer(1, 191)
        wrong.signing.secret_key = bytes(32 * [9])
        assert not await _answered(serial1, _request(v.sysid).pack(wrong), timeout_s=0.5)
        right = _request(v.sysid).pack(_signer(1, 191))
        assert await _answered(serial1, right, timeout_s=2.0)
        assert not await _answered(serial1, right, timeout_s=0.5)
        assert v.signing.counters.ignored == {"unsigned": 1, "bad_signature": 1, "replay": 1}
        assert v.link.frames_in_unverified == 3

        # All-zero key and timestamp 0 (signed, on SERIAL0): off; SERIAL1 answers unsigned again.
        gcs.writer.write(M.MAVLink_setup_signing_message(v.sysid, 1, bytes(32), 0).pack(_signer(0, 190)))
        await wait_for(lambda: not v.signing.enabled, timeout_s=2)
        assert await _answered(serial1, _request(v.sysid).pack(M.MAVLink(None, 255, 191)), timeout_s=2.0)
        frame = bytes((await gcs.recv("HEARTBEAT")).get_msgbuf())
        assert not frame[2] & 1
    finally:
        await serial1.close()
