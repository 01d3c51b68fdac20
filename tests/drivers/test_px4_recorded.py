"""The drivers against what a real PX4 SITL (SIH) sent, from the captures in tests/fixtures/px4 (README.md there).

Each test feeds recorded bytes to the code that must understand them: the parameter machines (PARAM_ERROR), the
read-back model of missions (normalise.readback), and the altitude rule of takeoff and reposition
(autopilot.command_altitude), checked against the command that made the real vehicle climb.
"""

from __future__ import annotations

import math
import struct

import pytest

from mavjet.drivers.mavlink import autopilot
from mavjet.drivers.mavlink.dialect import mavlink2 as M
from mavjet.drivers.mavlink.mission import MissionItem
from mavjet.drivers.mavlink.modes import Flavour
from mavjet.drivers.mavlink.normalise import differences, readback, same_item
from mavjet.drivers.mavlink.params import (
    ParamConfig,
    ParamEncoding,
    ParamUnknown,
    make_param_read,
    make_param_set,
)
from tests.fixtures.px4.replay import Frame, load, of_type

PX4 = Flavour.PX4


def _f32(x: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def _vehicle(frames: list[Frame]) -> int:
    return int(next(f.msg.get_srcSystem() for f in frames if not f.to_vehicle))


# ---------------------------------------------------------------------------- parameters (param_error.jsonl)


def test_an_unknown_name_read_ends_at_once_with_px4s_param_error() -> None:
    frames = load("param_error")
    sysid = _vehicle(frames)
    errors = of_type(frames, "PARAM_ERROR", to_vehicle=False)
    assert [(e.msg.param_id, e.msg.error) for e in errors] == [
        ("NOT_A_PARAM", 1), ("NOT_A_PARAM", 1), ("RTL_RETURN_ALT", 7)]  # read, set, set as INT32 (a REAL32)
    read = make_param_read("NOT_A_PARAM", target_system=sysid, target_component=1,
                           config=ParamConfig(encoding=ParamEncoding.BYTEWISE))
    (request,) = read.start(0.0)
    sent = of_type(frames, "PARAM_REQUEST_READ", to_vehicle=True)[1].msg
    assert (request.param_id, request.param_index) == (sent.param_id, sent.param_index)
    # Every vehicle frame as recorded, in order: the machine ends on the PARAM_ERROR, without a resend.
    out = [m for f in frames if not f.to_vehicle for m in read.on_message(f.msg, 0.1)]
    assert out == [] and read.done and read.result is None
    assert isinstance(read.error, ParamUnknown) and read.error.error == 1
    assert str(read.error) == "param NOT_A_PARAM: the vehicle has no such parameter (PARAM_ERROR DOES_NOT_EXIST)"
    assert read.attempts == 1 and read.on_tick(10.0) == []


def test_an_unknown_name_set_ends_at_once_and_a_known_one_reads_its_value() -> None:
    frames = load("param_error")
    sysid = _vehicle(frames)
    cfg = ParamConfig(encoding=ParamEncoding.BYTEWISE)
    put = make_param_set("NOT_A_PARAM", 1.0, M.MAV_PARAM_TYPE_REAL32, target_system=sysid, target_component=1,
                         config=cfg)
    put.start(0.0)
    for f in frames:
        if not f.to_vehicle:
            put.on_message(f.msg, 0.1)
    assert isinstance(put.error, ParamUnknown) and put.attempts == 1
    known = make_param_read("RTL_RETURN_ALT", target_system=sysid, target_component=1, config=cfg)
    known.start(0.0)
    for f in frames:
        if not f.to_vehicle:
            known.on_message(f.msg, 0.1)
    assert known.result is not None and known.result.value == 30.0 and known.result.param_type == 9


def test_a_param_error_about_another_name_or_vehicle_is_not_ours() -> None:
    (err,) = of_type(load("param_error"), "PARAM_ERROR", to_vehicle=False)[:1]
    sysid = err.msg.get_srcSystem()
    other = make_param_read("RTL_RETURN_ALT", target_system=sysid, target_component=1)
    other.start(0.0)
    other.on_message(err.msg, 0.1)
    assert not other.done
    elsewhere = make_param_read("NOT_A_PARAM", target_system=sysid + 1, target_component=1)
    elsewhere.start(0.0)
    elsewhere.on_message(err.msg, 0.1)
    assert not elsewhere.done


# ---------------------------------------------------------------------------- takeoff and reposition


def _climbs(frames: list[Frame], start: float, end: float) -> float:
    """The highest relative altitude (m) the vehicle reported between two capture times."""
    return max((f.msg.relative_alt / 1000 for f in of_type(frames, "GLOBAL_POSITION_INT", to_vehicle=False)
                if start <= f.t < end), default=0.0)


def test_px4_climbs_only_to_a_takeoff_altitude_above_mean_sea_level() -> None:
    frames = load("takeoff_and_reposition")
    home = of_type(frames, "HOME_POSITION", to_vehicle=False)[0].msg.altitude / 1000
    takeoffs = [f for f in of_type(frames, "COMMAND_LONG", to_vehicle=True) if f.msg.command == M.MAV_CMD_NAV_TAKEOFF]
    relative, amsl = takeoffs
    # Sent as a relative 10: accepted, "Already higher than takeoff altitude", never off the ground.
    texts = [(f.t, f.msg.text) for f in of_type(frames, "STATUSTEXT", to_vehicle=False)]
    assert relative.msg.param7 == 10.0
    assert any(relative.t <= t < relative.t + 1 and "Already higher than takeoff altitude" in s for t, s in texts)
    assert _climbs(frames, relative.t, amsl.t) < 1.0
    # The gateway's rule gives what made it climb: home AMSL + 10 (as float32 on the wire).
    z, frame = autopilot.command_altitude("px4", 10.0, home)
    assert _f32(z) == amsl.msg.param7 and frame == M.MAV_FRAME_GLOBAL_INT
    assert 9.0 <= _climbs(frames, amsl.t, amsl.t + 15) <= 11.0
    acks = [f.msg.result for f in of_type(frames, "COMMAND_ACK", to_vehicle=False) if f.msg.command == 22]
    assert acks == [M.MAV_RESULT_ACCEPTED, M.MAV_RESULT_ACCEPTED]  # both accepted at once: the ACK tells nothing


def test_px4_reads_a_reposition_altitude_above_mean_sea_level() -> None:
    frames = load("takeoff_and_reposition")
    home = of_type(frames, "HOME_POSITION", to_vehicle=False)[0].msg.altitude / 1000
    (repo,) = of_type(frames, "COMMAND_INT", to_vehicle=True)
    assert repo.msg.command == M.MAV_CMD_DO_REPOSITION and repo.msg.frame == M.MAV_FRAME_GLOBAL_INT
    z, frame = autopilot.command_altitude("px4", 15.0, home)
    assert (_f32(z), frame) == (repo.msg.z, repo.msg.frame)
    # ~12 s later it holds there: z m above mean sea level (its home was re-set 0.4 m higher at arming, so
    # relative_alt reads 14.5), within a metre of the target's latitude.
    after = [f.msg for f in of_type(frames, "GLOBAL_POSITION_INT", to_vehicle=False) if repo.t + 11.5 <= f.t < repo.t + 13]
    assert after and all(abs(p.alt / 1000 - repo.msg.z) < 0.5 and abs(p.lat - repo.msg.x) < 90 for p in after)


def test_ardupilot_keeps_the_height_above_home_in_a_relative_frame() -> None:
    assert autopilot.command_altitude("ardupilot", 10.0, 584.0) == (10.0, M.MAV_FRAME_GLOBAL_RELATIVE_ALT_INT)
    assert autopilot.command_altitude("ardupilot", 10.0, None) == (10.0, M.MAV_FRAME_GLOBAL_RELATIVE_ALT_INT)
    assert autopilot.command_altitude("px4", 10.0, None) is None  # no home: nothing can be sent


# ---------------------------------------------------------------------------- missions (mission_roundtrip.jsonl)


def _pairs(frames: list[Frame]) -> list[tuple[MissionItem, MissionItem]]:
    """(sent, read back) per (mission type, seq): the first upload of each list and its read-back."""
    sent: dict[tuple[int, int], MissionItem] = {}
    back: dict[tuple[int, int], MissionItem] = {}
    for f in of_type(frames, "MISSION_ITEM_INT"):
        item = MissionItem.from_message(f.msg)
        key = (item.mission_type, item.seq)
        (sent if f.to_vehicle else back).setdefault(key, item)
    return [(sent[k], back[k]) for k in sorted(back)]


def test_the_px4_read_back_model_matches_what_px4_returned() -> None:
    pairs = _pairs(load("mission_roundtrip"))
    assert len(pairs) == 6 + 5 + 1  # mission, fence (polygon + circle), rally
    for sent, back in pairs:
        assert same_item(sent, back, PX4), differences(sent, back, PX4)
        assert readback(sent, PX4).canonical() == readback(back, PX4).canonical()
    # What PX4 changed: LOITER_TIME param4 NaN -> 0, fence items autocontinue 1 -> 0.
    changed = {(s.mission_type, s.seq) for s, b in pairs
               if (s.param4, s.autocontinue) != (b.param4, b.autocontinue) and not (math.isnan(s.param4) and math.isnan(b.param4))}
    assert changed == {(0, 3), (1, 0), (1, 1), (1, 2), (1, 3), (1, 4)}


def test_px4_refuses_a_terrain_frame_item_as_unsupported() -> None:
    frames = load("mission_roundtrip")
    acks = [f.msg.type for f in of_type(frames, "MISSION_ACK", to_vehicle=False)]
    assert acks == [0, 0, 0, M.MAV_MISSION_UNSUPPORTED_FRAME]
    last = [f.msg for f in of_type(frames, "MISSION_ITEM_INT", to_vehicle=True)][-1]
    assert last.frame == M.MAV_FRAME_GLOBAL_TERRAIN_ALT


@pytest.mark.parametrize("name", ["takeoff_and_reposition", "mission_roundtrip", "param_error"])
def test_every_capture_frame_is_px4_mavlink2_and_decodes(name: str) -> None:
    frames = load(name)
    assert frames and all(f.raw[0] == 0xFD and len(f.raw) == 12 + f.raw[1] for f in frames)
    heartbeats = [f.msg for f in of_type(frames, "HEARTBEAT", to_vehicle=False)]
    assert heartbeats and all(h.autopilot == M.MAV_AUTOPILOT_PX4 for h in heartbeats)
