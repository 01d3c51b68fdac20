"""Sans-IO routing rules: frame splitting (signatures kept), filters, loop prevention, route-to-route, transfer steps."""

from __future__ import annotations

from mavjet.drivers.mavlink.dialect import mavlink2 as m
from mavjet.drivers.mavlink.router import (
    FrameSplitter,
    RouteFilter,
    Router,
    TransferStep,
    frame_source,
    frame_target,
    mission_type_of,
    refusal,
    transfer_step,
)
from mavjet.drivers.mavlink.signing import MavSigning


def _frame(msg: object, sysid: int = 1, compid: int = 1, *, signing: MavSigning | None = None) -> bytes:
    mav = m.MAVLink(None, srcSystem=sysid, srcComponent=compid)
    if signing is not None:
        signing.attach(mav)
        signing.before_send()
    data: bytes = msg.pack(mav)  # type: ignore[attr-defined]
    return data


def _hb(sysid: int = 1, compid: int = 1) -> bytes:
    return _frame(m.MAVLink_heartbeat_message(2, 3, 0, 0, 4, 3), sysid, compid)


def test_splitter_returns_whole_frames_across_chunks_and_skips_junk() -> None:
    a, b = _hb(1), _frame(m.MAVLink_param_request_read_message(1, 1, b"SYSID_THISMAV", -1), 255, 190)
    stream = b"\x00junk" + a + b"\xfd\x01" + b
    sp = FrameSplitter()
    out: list[bytes] = []
    for i in range(0, len(stream), 7):
        out += sp.feed(stream[i:i + 7])
    assert out == [a, b]
    assert sp.junk_bytes > 0


def test_splitter_keeps_signature_bytes() -> None:
    signed = _frame(m.MAVLink_heartbeat_message(2, 3, 0, 0, 4, 3), signing=MavSigning(bytes(range(32))))
    assert signed[2] & 0x01
    assert FrameSplitter().feed(signed + _hb()) == [signed, _hb()]


def test_mavlink1_frames_split() -> None:
    mav = m.MAVLink(None, srcSystem=7, srcComponent=1)
    mav.WIRE_PROTOCOL_VERSION = "1.0"
    v1 = bytes(m.MAVLink_heartbeat_message(2, 3, 0, 0, 4, 3).pack(mav, force_mavlink1=True))
    assert v1[0] == 0xFE
    assert FrameSplitter().feed(v1) == [v1]
    assert frame_source(v1) == (7, 1)


def test_filter_by_source_sysid_and_compid() -> None:
    r = Router()
    r.add_route("all")
    r.add_route("ap", RouteFilter(sysids=frozenset({1}), compids=frozenset({1})))
    assert r.from_vehicle(_hb(1, 1), 0.0) == ["all", "ap"]
    assert r.from_vehicle(_hb(1, 154), 0.0) == ["all"]  # a gimbal: not for the autopilot-only route
    assert r.stats["ap"].filtered == 1


def test_loop_prevention_drops_a_source_seen_on_another_side() -> None:
    r = Router(loop_window_s=5.0)
    r.add_route("gcs1")
    r.add_route("gcs2")
    gcs = _hb(255, 190)
    assert r.from_route("gcs1", gcs, 0.0)
    assert not r.from_route("gcs2", gcs, 1.0)  # the same ground station through a second route: a loop
    assert r.stats["gcs2"].loops == 1
    assert r.from_vehicle(gcs, 1.5) == []  # echoed back from the vehicle side: never sent out again
    r2 = Router()
    r2.add_route("gcs")
    r2.from_vehicle(_hb(1, 1), 0.0)
    assert not r2.from_route("gcs", _hb(1, 1), 0.5)  # the vehicle's own frame coming back from a route
    assert r2.from_route("gcs", gcs, 0.5)
    assert r.from_route("gcs2", gcs, 10.0)  # after the window a moved ground station is heard again


def test_transfer_steps_and_refusal() -> None:
    count = _frame(m.MAVLink_mission_count_message(1, 1, 3, m.MAV_MISSION_TYPE_FENCE), 255, 190)
    assert transfer_step(count) is TransferStep.START
    assert mission_type_of(count) == m.MAV_MISSION_TYPE_FENCE
    assert transfer_step(_frame(m.MAVLink_mission_request_int_message(1, 1, 0, 0), 255, 190)) is TransferStep.PART
    assert transfer_step(_frame(m.MAVLink_mission_ack_message(1, 1, 0, 0), 255, 190)) is TransferStep.END
    assert transfer_step(_hb()) is TransferStep.NONE
    ack = m.MAVLink(None).decode(bytearray(refusal(count, vehicle_sysid=1, vehicle_compid=1)))
    assert ack.get_type() == "MISSION_ACK"
    assert (ack.get_srcSystem(), ack.target_system, ack.target_component) == (1, 255, 190)
    assert ack.type == m.MAV_MISSION_DENIED
    assert ack.mission_type == m.MAV_MISSION_TYPE_FENCE


def _cmd(target: tuple[int, int], sysid: int = 255, compid: int = 190) -> bytes:
    msg = m.MAVLink_command_long_message(target[0], target[1], m.MAV_CMD_DO_SET_MODE, 0, 1, 4, 0, 0, 0, 0, 0)
    return _frame(msg, sysid, compid)


def test_frame_target_reads_the_payload_of_mavlink2_and_1_frames() -> None:
    assert frame_target(_cmd((7, 3))) == (7, 3)
    assert frame_target(_hb()) == (0, 0)  # HEARTBEAT has no target: broadcast
    trimmed = _frame(m.MAVLink_param_request_read_message(5, 0, b"X", -1))
    assert frame_target(trimmed) == (5, 0)  # target_component 0 trimmed away by MAVLink 2
    mav1 = m.MAVLink(None, srcSystem=255, srcComponent=190)
    mav1.WIRE_PROTOCOL_VERSION = "1.0"
    v1 = bytes(m.MAVLink_param_request_read_message(9, 1, b"X", -1).pack(mav1, force_mavlink1=True))
    assert v1[0] == 0xFE and frame_target(v1) == (9, 1)


def test_route_frames_reach_other_routes_like_mavlink_router() -> None:
    r = Router()
    for name in ("gcs1", "gcs2", "only_sys1"):
        r.add_route(name)
    r.filters["only_sys1"] = RouteFilter(sysids=frozenset({1}))
    r.from_vehicle(_hb(1, 1), 0.0)
    assert r.from_route("gcs2", _hb(254, 190), 0.0)
    assert r.from_route("only_sys1", _hb(1, 200), 0.0)  # a companion app on sysid 1 (allowed by the filter)
    hb = _hb(255, 190)
    assert r.from_route("gcs1", hb, 0.1)
    assert r.to_routes("gcs1", hb) == ["gcs2"]  # broadcast: everyone else whose filter takes sysid 255
    assert r.stats["only_sys1"].filtered == 1
    assert r.to_routes("gcs1", _cmd((254, 190))) == ["gcs2"]  # targeted at the station seen on gcs2
    assert r.to_routes("gcs1", _cmd((254, 0))) == ["gcs2"]  # any component of a system seen there
    assert r.to_routes("gcs1", _cmd((254, 7))) == []  # a component never seen
    assert r.to_routes("gcs1", _cmd((1, 1))) == []  # for the vehicle only: the vehicle side gets it
    assert r.to_routes("gcs1", _cmd((0, 0))) == ["gcs2"]  # target_system 0: broadcast
    assert r.to_routes("gcs2", _hb(1, 200)) == ["gcs1"]  # never to the route where its source was seen
    assert r.from_route("gcs2", _hb(254, 190), 0.2)
    assert "gcs1" not in r.to_routes("gcs1", _hb(255, 190))  # never back to its source route
    # A station that moved to another route (after the loop window) is reached there.
    assert r.from_route("gcs1", _hb(254, 190), 10.0)
    assert r.to_routes("gcs2", _cmd((254, 190), sysid=250)) == ["gcs1"]
