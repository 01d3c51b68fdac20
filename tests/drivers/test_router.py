"""Sans-IO routing rules: frame splitting (signatures kept), filters, loop prevention, transfer steps."""

from __future__ import annotations

from drivers.mavlink.dialect import mavlink2 as m
from drivers.mavlink.router import (
    FrameSplitter,
    RouteFilter,
    Router,
    TransferStep,
    frame_source,
    mission_type_of,
    refusal,
    transfer_step,
)
from drivers.mavlink.signing import MavSigning


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
