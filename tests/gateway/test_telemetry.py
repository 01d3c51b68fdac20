"""The telemetry model's rules, fed with pymavlink messages."""

from __future__ import annotations

from typing import Any

from mavjet.drivers.mavlink.codec import MavCodec
from mavjet.drivers.mavlink.dialect import mavlink2 as m
from mavjet.gateway.twin.telemetry import TelemetryModel

ARMED = m.MAV_MODE_FLAG_SAFETY_ARMED | m.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED
DISARMED = m.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED
_enc = MavCodec(src_system=1, src_component=1)


def framed(msg: Any) -> Any:
    """Round-trip through the codec so headers are real."""
    return MavCodec().feed(_enc.encode(msg))[0]


def hb(mode: int = 4, base: int = DISARMED, status: int = m.MAV_STATE_STANDBY) -> Any:
    return framed(m.MAVLink_heartbeat_message(m.MAV_TYPE_QUADROTOR, m.MAV_AUTOPILOT_ARDUPILOTMEGA, base, mode, status, 3))


def pos(alt_m: float, lat: float = 47.0, lon: float = 8.0, boot_ms: int = 1000) -> Any:
    return framed(m.MAVLink_global_position_int_message(boot_ms, int(lat * 1e7), int(lon * 1e7), int((400 + alt_m) * 1000),
                                                        int(alt_m * 1000), 0, 0, 0, 9000))


def ext(landed: int) -> Any:
    return framed(m.MAVLink_extended_sys_state_message(0, landed))


def feed(model: TelemetryModel, *msgs: Any, t0: int = 1_000_000_000) -> list[str]:
    for i, msg in enumerate(msgs):
        model.update(msg, t0 + i)
    return [e.type for e in model.drain_events()]


def test_first_heartbeat_sets_identity_without_events() -> None:
    v = TelemetryModel(vid="VID-001")
    assert feed(v, hb()) == []
    assert (v.flavour, v.vehicle_class, v.mode, v.armed) == ("ardupilot", "copter", "GUIDED", False)
    assert v.channels["status"]["mode"] == "GUIDED"


def test_flight_lifecycle_events_in_order_with_stats() -> None:
    v = TelemetryModel(vid="VID-001")
    feed(v, hb(), ext(m.MAV_LANDED_STATE_ON_GROUND), pos(0.0))
    seq = feed(
        v, hb(base=ARMED), ext(m.MAV_LANDED_STATE_TAKEOFF), pos(5.0), pos(12.0, lat=47.001),
        hb(mode=6, base=ARMED), ext(m.MAV_LANDED_STATE_IN_AIR), pos(3.0),
        ext(m.MAV_LANDED_STATE_ON_GROUND), hb(mode=6, base=DISARMED),
    )
    assert seq == ["armed", "takeoff", "mode_changed", "landed", "disarmed"]


def test_landed_and_disarmed_carry_flight_summary() -> None:
    v = TelemetryModel(vid="VID-001")
    feed(v, hb(), ext(m.MAV_LANDED_STATE_ON_GROUND), pos(0.0))
    v.update(hb(base=ARMED), 1)
    v.update(ext(m.MAV_LANDED_STATE_IN_AIR), 2)
    v.update(pos(20.0), 3)
    v.update(pos(20.0, lat=47.001), 4)  # ~111 m north
    v.update(ext(m.MAV_LANDED_STATE_ON_GROUND), 5)
    v.update(hb(base=DISARMED), 6)
    evs = {e.type: e for e in v.drain_events()}
    assert evs["landed"].data["max_alt_m"] == 20.0
    assert 100 < evs["landed"].data["distance_m"] < 125
    assert evs["disarmed"].data["max_alt_m"] == 20.0
    assert evs["armed"].msg_id == "VID-001:armed:1"


def test_failsafe_from_statustext_then_critical_heartbeat_is_one_event() -> None:
    v = TelemetryModel(vid="VID-001")
    feed(v, hb(base=ARMED))
    text = framed(m.MAVLink_statustext_message(m.MAV_SEVERITY_CRITICAL, b"Battery failsafe"))
    types = feed(v, text, hb(mode=6, base=ARMED, status=m.MAV_STATE_CRITICAL))
    assert types.count("failsafe") == 1
    assert "statustext" in types and "mode_changed" in types
    assert v.failsafe_active


def test_failsafe_type_and_action_from_heartbeat() -> None:
    v = TelemetryModel(vid="VID-001")
    feed(v, hb(base=ARMED))
    v.update(framed(m.MAVLink_statustext_message(m.MAV_SEVERITY_WARNING, b"GCS Failsafe")), 10)
    v.update(hb(mode=6, base=ARMED, status=m.MAV_STATE_CRITICAL), 11)
    fs = [e for e in v.drain_events() if e.type == "failsafe"]
    assert len(fs) == 1
    assert fs[0].data["failsafe_type"] == "gcs" and fs[0].data["action_taken"] == "RTL"
    v.update(hb(mode=6, base=ARMED, status=m.MAV_STATE_ACTIVE), 12)
    assert not v.failsafe_active


def test_statustext_of_every_severity_is_an_event() -> None:
    # Issue 12: info-level lines carry meaning ("Mission: 5 WP"); they were dropped before.
    v = TelemetryModel(vid="VID-001")
    feed(v, hb())
    assert feed(v, framed(m.MAVLink_statustext_message(m.MAV_SEVERITY_INFO, b"EKF3 IMU0 is using GPS"))) == ["statustext"]
    assert feed(v, framed(m.MAVLink_statustext_message(m.MAV_SEVERITY_ERROR, b"PreArm: Need 3D Fix"))) == ["statustext"]


def test_gps_fix_home_and_geofence_events() -> None:
    v = TelemetryModel(vid="VID-001")
    feed(v, hb())
    gps = [framed(m.MAVLink_gps_raw_int_message(0, fix, 0, 0, 0, 100, 100, 0, 0, sats)) for fix, sats in ((1, 4), (3, 10), (3, 11))]
    assert feed(v, *gps) == ["gps_fix_changed"]
    home = framed(m.MAVLink_home_position_message(int(47e7), int(8e7), 400000, 0, 0, 0, [1, 0, 0, 0], 0, 0, 0))
    assert feed(v, home, home) == ["home_set"]
    fence = framed(m.MAVLink_fence_status_message(1, 1, 1, 0))
    assert feed(v, fence, fence) == ["geofence_breach"]


def test_sample_time_is_the_gateway_receive_time_never_the_vehicle_clock() -> None:
    # SYSTEM_TIME used to map the boot clock to UTC; a sped-up sim or a wrong
    # GPS time then put samples in the future. The time is now the receive
    # time, and the boot time is kept as its own field.
    v = TelemetryModel(vid="VID-001")
    unix_us = 1_700_000_000_000_000
    v.update(framed(m.MAVLink_system_time_message(unix_us, 10_000)), 5)
    v.update(pos(1.0, boot_ms=12_000), 6)
    assert v.sample_ns["position"] == 6
    assert v.channels["position"]["time_boot_ms"] == 12_000
    assert v.last_boot_ms == 10_000
    att = framed(m.MAVLink_attitude_message(13_000, 0.1, 0.2, 0.3, 0.0, 0.0, 0.0))
    v.update(att, 7)
    assert v.sample_ns["attitude"] == 7 and v.channels["attitude"]["time_boot_ms"] == 13_000
    # Without SYSTEM_TIME the receive time is used too.
    w = TelemetryModel(vid="VID-002")
    w.update(pos(1.0), 777)
    assert w.sample_ns["position"] == 777


def test_duplicate_event_ids_get_a_discriminator() -> None:
    v = TelemetryModel(vid="VID-001")
    a = v.emit("statustext", 5, text="a")
    b = v.emit("statustext", 5, text="b")
    assert a.msg_id != b.msg_id


def test_px4_modes_decoded() -> None:
    v = TelemetryModel(vid="VID-009")
    px4 = framed(m.MAVLink_heartbeat_message(m.MAV_TYPE_QUADROTOR, m.MAV_AUTOPILOT_PX4, DISARMED, (4 << 24) | (4 << 16), 3, 3))
    v.update(px4, 1)
    assert v.flavour == "px4" and v.mode == "AUTO.MISSION"


def test_disarm_at_touchdown_lands_first() -> None:
    v = TelemetryModel(vid="VID-001")
    feed(v, hb(), ext(m.MAV_LANDED_STATE_ON_GROUND), pos(0.0))
    types = feed(v, hb(base=ARMED), ext(m.MAV_LANDED_STATE_IN_AIR), pos(10.0), pos(0.1), hb(base=DISARMED),
                 ext(m.MAV_LANDED_STATE_ON_GROUND))
    assert types == ["armed", "takeoff", "landed", "disarmed"]


# -- status text: every severity, "Reached command #N", repeats collapsed -----------------
S = 1_000_000_000


def text(msg: str, severity: int = m.MAV_SEVERITY_INFO) -> Any:
    return framed(m.MAVLink_statustext_message(severity, msg.encode()))


def reached(seq: int) -> Any:
    return framed(m.MAVLink_mission_item_reached_message(seq))


def events_at(model: TelemetryModel, *timed: tuple[float, Any]) -> list[Any]:
    for t_s, msg in timed:
        model.update(msg, int(t_s * S))
    return model.drain_events()


def test_info_and_debug_texts_are_events_with_count_one() -> None:
    v = TelemetryModel(vid="VID-001")
    evs = events_at(v, (1, text("Mission: 5 WP")), (2, text("EKF3 IMU0 is using GPS", m.MAV_SEVERITY_DEBUG)))
    assert [(e.type, e.data["text"], e.data["severity_name"], e.data["count"]) for e in evs] == [
        ("statustext", "Mission: 5 WP", "info", 1), ("statustext", "EKF3 IMU0 is using GPS", "debug", 1)]
    assert not any(e.internal for e in evs)


def test_reached_text_and_mission_item_reached_are_one_event() -> None:
    v = TelemetryModel(vid="VID-001")
    # ArduPilot: the text first, the message on its next telemetry slot; the text is not a statustext event.
    evs = events_at(v, (1.0, text("Reached command #2")), (1.2, reached(2)))
    assert [(e.type, e.data["seq"]) for e in evs] == [("mission_item_reached", 2)]
    # From now on the vehicle is known to send MISSION_ITEM_REACHED: it alone makes the event.
    evs = events_at(v, (5.0, text("Reached command #3")), (5.1, reached(4)), (9.0, reached(4)))
    assert [(e.type, e.data["seq"]) for e in evs] == [("mission_item_reached", 4), ("mission_item_reached", 4)]


def test_reached_message_alone_and_text_alone() -> None:
    v = TelemetryModel(vid="VID-001")
    assert [(e.type, e.data["seq"]) for e in events_at(v, (1, reached(1)), (2, reached(2)))] == [
        ("mission_item_reached", 1), ("mission_item_reached", 2)]
    w = TelemetryModel(vid="VID-002")  # a vehicle that sends only the text
    evs = events_at(w, (1, text("Reached command #1")), (20, text("Reached command #1")))
    assert [(e.type, e.data["seq"]) for e in evs] == [("mission_item_reached", 1), ("mission_item_reached", 1)]


def test_repeated_text_collapses_into_one_event_per_window_with_count() -> None:
    v = TelemetryModel(vid="VID-001")
    prearm = "PreArm: Need Position Estimate"
    warn = m.MAV_SEVERITY_CRITICAL
    # Every 4 s for 70 s, as ArduPilot repeats a failing PreArm check.
    published = []
    for i in range(18):
        t = 10 + 4 * i
        published += [e for e in events_at(v, (t, text(prearm, warn))) if not e.internal]
        v.flush_repeats((t + 2) * S)  # the twin's link tick
        published += v.drain_events()
    assert [e.data["count"] for e in published] == [1, 7, 7]
    assert published[1].data["window_s"] == 30 and published[1].time_ns == 38 * S  # the newest repeat's time
    assert all(e.data["text"] == prearm and e.data["severity"] == warn for e in published)
    assert len({e.msg_id for e in published}) == 3
    # The rest of the open window is reported at shutdown; then the text starts afresh.
    v.flush_repeats(100 * S, flush=True)
    assert [e.data["count"] for e in v.drain_events()] == [3]
    assert not v.repeats_pending
    assert [e.data["count"] for e in events_at(v, (200, text(prearm, warn)))] == [1]


def test_repeats_reach_subscribers_as_internal_events_and_other_texts_are_not_collapsed() -> None:
    v = TelemetryModel(vid="VID-001")
    evs = events_at(v, (1, text("PreArm: a")), (2, text("PreArm: a")), (3, text("PreArm: a", m.MAV_SEVERITY_WARNING)),
                    (4, text("PreArm: b")))
    assert [(e.data["text"], e.data["severity"], e.internal) for e in evs] == [
        ("PreArm: a", 6, False), ("PreArm: a", 6, True), ("PreArm: a", 4, False), ("PreArm: b", 6, False)]


def test_a_window_without_repeats_ends_the_episode_without_a_summary() -> None:
    v = TelemetryModel(vid="VID-001")
    events_at(v, (1, text("Throttle high")))
    v.flush_repeats(40 * S)
    assert v.drain_events() == [] and not v.repeats_pending
    # Without a tick in between, the next line after the window still counts as new.
    events_at(v, (50, text("Throttle high")), (55, text("Throttle high")))
    # At 200 s the window of the 50 s line (one repeat) ends: its summary, then the line as new.
    assert [(e.data["count"], e.internal) for e in events_at(v, (200, text("Throttle high")))] == [(1, False), (1, False)]
