"""Pure pieces of the simulator, fed with values and bytes: framing, geometry, schedules, params."""

from __future__ import annotations

import math

import pytest
from pymavlink.dialects.v20 import ardupilotmega as M

from mavjet.contract.errors import ConfigError
from mavjet.sim import encoder, geo, params, streams
from mavjet.sim.fleet import SimConfig
from mavjet.sim.modes import ARDUPILOT, PX4

PACKERS = [
    (encoder.HEARTBEAT, M.MAVLink_heartbeat_message, (2, 3, 217, 4, 4, 3)),
    (encoder.GLOBAL_POSITION_INT, M.MAVLink_global_position_int_message, (1234, -353632610, 1491652300, 584000, 0, -5, 7, 0, 35900)),
    (encoder.ATTITUDE, M.MAVLink_attitude_message, (99, 0.1, -0.2, 3.0, 0.0, 0.0, 0.0)),
    (encoder.SYSTEM_TIME, M.MAVLink_system_time_message, (1_700_000_000_000_000, 42)),
    (encoder.VFR_HUD, M.MAVLink_vfr_hud_message, (1.5, 1.5, 270, 48, 600.0, -0.5)),
    (encoder.EXTENDED_SYS_STATE, M.MAVLink_extended_sys_state_message, (0, 2)),
    (encoder.MISSION_CURRENT, M.MAVLink_mission_current_message, (3, 5, 3, 1)),
    (encoder.FENCE_STATUS, M.MAVLink_fence_status_message, (1, 2, 3, 4000, 0)),
    (encoder.SYS_STATUS, M.MAVLink_sys_status_message, (1, 2, 3, 180, 16000, 150, 0, 0, 0, 0, 0, 0, 87, 0, 0, 0)),
    (encoder.GPS_RAW_INT, M.MAVLink_gps_raw_int_message, (1, 3, 10, 20, 30, 121, 200, 5, 6, 12, 40, 300, 500, 200, 0, 0)),
]


@pytest.mark.parametrize(("packer", "cls", "values"), PACKERS, ids=[p[1].msgname for p in PACKERS])
def test_fast_packer_matches_pymavlink(packer: encoder.Packer, cls: type, values: tuple[object, ...]) -> None:
    mav = M.MAVLink(None, 7, 1)
    mav.seq = 200
    assert packer.frame(7, 1, 200, values) == cls(*values).pack(mav)
    parsed = M.MAVLink(None, 255, 0).parse_buffer(packer.frame(7, 1, 200, values))
    assert parsed is not None and parsed[0].get_type() == cls.msgname


def test_all_zero_payload_keeps_one_byte() -> None:
    frame = encoder.EXTENDED_SYS_STATE.frame(1, 1, 0, (0, 0))
    assert frame[1] == 1  # payload length
    assert M.MAVLink(None, 255, 0).parse_buffer(frame)[0].landed_state == 0


def test_packer_refuses_messages_with_arrays() -> None:
    with pytest.raises(ValueError, match="array"):
        encoder.Packer(M.MAVLink_battery_status_message)


def test_geo_offset_roundtrip_and_polygon() -> None:
    lat, lon = geo.offset(-35.0, 149.0, 100.0, -50.0)
    n, e = geo.north_east(-35.0, 149.0, lat, lon)
    assert n == pytest.approx(100.0, abs=1e-6) and e == pytest.approx(-50.0, abs=1e-6)
    assert geo.distance_m(-35.0, 149.0, lat, lon) == pytest.approx(math.hypot(100, 50), abs=1e-6)
    assert geo.bearing_deg(0.0, 1.0) == pytest.approx(90.0)
    square = [(0.0, 0.0), (0.0, 1.0), (1.0, 1.0), (1.0, 0.0)]
    assert geo.inside_polygon(0.5, 0.5, square)
    assert not geo.inside_polygon(1.5, 0.5, square)
    assert not geo.inside_polygon(0.5, 0.5, square[:2])


def test_schedule_heartbeat_only_then_rates() -> None:
    s = streams.Schedule()
    sent = [m for k in range(100) for m in s.due(k * 0.1)]  # 10 s
    assert set(sent) == {streams.HEARTBEAT} and len(sent) == 10
    s.set_interval(streams.GLOBAL_POSITION_INT, 100_000, 10.0)
    s.request_stream(12, 2.0, True, 10.0)  # EXTRA3: SYSTEM_TIME, BATTERY_STATUS
    sent = [m for k in range(101, 201) for m in s.due(k * 0.1)]
    assert sent.count(streams.GLOBAL_POSITION_INT) == pytest.approx(100, abs=1)
    assert sent.count(streams.SYSTEM_TIME) == pytest.approx(20, abs=1)
    assert sent.count(streams.BATTERY_STATUS) == pytest.approx(20, abs=1)
    assert s.set_interval(streams.GLOBAL_POSITION_INT, -1, 20.0)
    assert s.interval(streams.GLOBAL_POSITION_INT) is None
    assert not s.set_interval(9999, 1000, 20.0)  # not a message the sim streams
    s.request_stream(0, 0.0, False, 20.0)  # stop all
    assert s.interval(streams.SYSTEM_TIME) is None


def test_schedule_coarse_ticks_keep_the_rate() -> None:
    s = streams.Schedule()
    s.set_interval(streams.ATTITUDE, 50_000, 0.0)  # 20 Hz, stepped at 10 Hz
    sent = [m for k in range(1, 101) for m in s.due(k * 0.1)]
    assert sent.count(streams.ATTITUDE) == pytest.approx(200, abs=2)


def test_schedule_after_a_stall_catches_up_a_few_slots_then_resynchronises() -> None:
    s = streams.Schedule()
    s.set_interval(streams.ATTITUDE, 100_000, 0.0)
    s.set_interval(streams.GLOBAL_POSITION_INT, 100_000, 0.0)
    assert s.due(0.0) == [streams.HEARTBEAT] and s.due(0.09) == []  # a new bucket waits one interval
    first = s.due(0.1)  # then both, one each, in message-id order
    assert first == sorted(first) == [streams.ATTITUDE, streams.GLOBAL_POSITION_INT]
    late = s.due(5.0)  # 50 slots missed
    assert late.count(streams.ATTITUDE) == streams.MAX_CATCH_UP
    assert late.count(streams.GLOBAL_POSITION_INT) == streams.MAX_CATCH_UP
    assert s.due(5.05) == []  # resynchronised one interval after the stall, not bursting
    assert s.due(5.1) == [streams.ATTITUDE, streams.GLOBAL_POSITION_INT]
    assert s.next_due == pytest.approx(5.2)


def test_schedule_buckets_messages_of_one_interval_together_as_ardupilot_does() -> None:
    # ArduPilot (GCS_Common.cpp, set_ap_message_interval): a message asked for at an interval a
    # bucket already has joins that bucket and its phase; the bucket sends its messages together.
    s = streams.Schedule()
    s.set_interval(streams.GLOBAL_POSITION_INT, 100_000, 0.0)
    assert s.due(0.0) == [streams.HEARTBEAT]  # the new bucket's first slot is one interval on
    s.set_interval(streams.ATTITUDE, 100_000, 0.037)  # asked 37 ms later: same bucket, same slots
    s.set_interval(streams.VFR_HUD, 500_000, 0.05)  # another interval: a bucket of its own
    assert s.due(0.05) == []  # VFR_HUD's new bucket: first at 0.55
    slots = [(round(k * 0.01, 2), s.due(k * 0.01)) for k in range(6, 300)]  # 10 ms steps to 3 s
    sent = [(t, ids) for t, ids in slots if ids]
    together = [t for t, ids in sent if streams.ATTITUDE in ids and streams.GLOBAL_POSITION_INT in ids]
    alone = [t for t, ids in sent if (streams.ATTITUDE in ids) != (streams.GLOBAL_POSITION_INT in ids)]
    assert len(together) == 29 and alone == []
    # On the bucket's slots (k * 0.1 s, polled within 10 ms), not ATTITUDE's own (0.037 + k * 0.1 s).
    assert all(abs(t * 10 - round(t * 10)) <= 0.1 + 1e-6 for t in together)
    # Moved to another interval, ATTITUDE leaves the bucket; GLOBAL_POSITION_INT keeps its phase.
    s.set_interval(streams.ATTITUDE, 500_000, 3.0)
    assert s.active()[streams.ATTITUDE] == 0.5
    later = [(round(k * 0.01, 2), s.due(k * 0.01)) for k in range(300, 400)]
    att = [t for t, ids in later if streams.ATTITUDE in ids]
    hud = [t for t, ids in later if streams.VFR_HUD in ids]
    assert att == hud == [3.05, 3.55]  # joined VFR_HUD's bucket
    gpi = [t for t, ids in later if streams.GLOBAL_POSITION_INT in ids]
    assert len(gpi) == 10 and all(abs(t * 10 - round(t * 10)) <= 0.1 + 1e-6 for t in gpi)


def test_schedule_px4_times_each_message_on_its_own() -> None:
    s = streams.Schedule(bucketed=False)
    s.set_interval(streams.GLOBAL_POSITION_INT, 100_000, 0.0)
    s.set_interval(streams.ATTITUDE, 100_000, 0.037)
    sent = [(round(k * 0.01, 2), s.due(k * 0.01)) for k in range(1, 100)]
    att = [t for t, ids in sent if streams.ATTITUDE in ids]
    gpi = [t for t, ids in sent if streams.GLOBAL_POSITION_INT in ids]
    assert att[:2] == [0.04, 0.14] and gpi[:2] == [0.01, 0.1]  # 0.0 was not polled: its slot goes at 0.01
    # A new interval starts a new cadence at once, as before the buckets: not at the old one's next slot.
    assert sorted(s.due(1.02)) == [streams.HEARTBEAT, streams.GLOBAL_POSITION_INT]  # their 1.0 s slots
    s.set_interval(streams.GLOBAL_POSITION_INT, 50_000, 1.02)  # the old cadence's next slot: 1.1
    assert s.due(1.02) == [streams.GLOBAL_POSITION_INT]
    s.set_interval(streams.HEARTBEAT, 200_000, 1.03)  # timed on its own on both flavours; old next: 2.0
    assert s.due(1.03) == [streams.HEARTBEAT]


def test_params_coerce_to_type() -> None:
    assert params.coerce(params.BY_NAME["FENCE_ENABLE"], 2.6) == 3.0
    assert params.coerce(params.BY_NAME["FENCE_ENABLE"], 1000) == 127.0  # INT8 clamps
    assert params.coerce(params.BY_NAME["WPNAV_SPEED"], 742.25) == 742.25
    assert len(params.SPECS) >= 40 and len(params.INDEX) == len(params.SPECS)
    assert params.defaults(7)["MAV_SYSID"] == 7.0  # the ArduPilot 4.7 name
    assert "SYSID_THISMAV" not in params.defaults(7)  # converted at load, not an alias


def test_mode_tables() -> None:
    assert ARDUPILOT.by_name("GUIDED").custom_mode == 4  # type: ignore[union-attr]
    assert ARDUPILOT.by_name("RTL").custom_mode == 6  # type: ignore[union-attr]
    assert ARDUPILOT.by_custom(9).name == "LAND"  # type: ignore[union-attr]
    assert PX4.by_name("AUTO.MISSION").custom_mode == 0x04040000  # type: ignore[union-attr]
    assert PX4.by_custom(3 << 16).name == "POSCTL"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("kw", "key"),
    [
        ({"vehicles": 0}, "vehicles"),
        ({"speedup": 0}, "speedup"),
        ({"flavour": "inav"}, "flavour"),
        ({"loss": 1.5}, "loss"),
        ({"base_port": 65530, "vehicles": 3}, "base_port"),
        ({"tick_s": 0}, "tick_s"),
    ],
)
def test_config_validation_names_the_key(kw: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        SimConfig(**kw)  # type: ignore[arg-type]
    assert err.value.key == key


def test_sysids_wrap_for_large_fleets() -> None:
    cfg = SimConfig(vehicles=300, base_port=0)
    assert [cfg.sysid(i) for i in (0, 254, 255, 299)] == [1, 255, 1, 45]
