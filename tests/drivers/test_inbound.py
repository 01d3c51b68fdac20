"""A link's inbound path, sans-IO: bytes a real ArduCopter sent in, the vehicle's batches out.

Fed with frames from tests/drivers/fixtures/ardupilot_frames.json; it also runs
compiled (tests/ops/test_compile.py), where it must behave the same.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import structlog

from mavjet.drivers.mavlink.codec import MavCodec
from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.drivers.mavlink.inbound import Inbound

FRAMES = [bytes.fromhex(h) for h in
          json.loads((Path(__file__).parent / "fixtures" / "ardupilot_frames.json").read_text())["frames"]]
WIRE = b"".join(FRAMES)


def _from(sysid: int, msg: Any, compid: int = 1) -> bytes:
    return MavCodec(src_system=sysid, src_component=compid).encode(msg)


def _autopilot_heartbeat() -> Any:
    return mavlink2.MAVLink_heartbeat_message(mavlink2.MAV_TYPE_QUADROTOR, mavlink2.MAV_AUTOPILOT_ARDUPILOTMEGA,
                                              0, 0, mavlink2.MAV_STATE_STANDBY, 3)


def _gcs_heartbeat() -> Any:
    return mavlink2.MAVLink_heartbeat_message(mavlink2.MAV_TYPE_GCS, mavlink2.MAV_AUTOPILOT_INVALID, 0, 0, 0, 3)


def _attitude(t_ms: int) -> Any:
    return mavlink2.MAVLink_attitude_message(t_ms, 0.1, 0.2, 0.3, 0.0, 0.0, 0.0)


class Rig:
    def __init__(self, target_system: int = 0) -> None:
        self.batches: list[tuple[list[Any], int]] = []
        self.heartbeats: list[float] = []
        self.inbound = Inbound(name="v1", codec=MavCodec(), on_messages=self.on_messages,
                               on_heartbeat=self.heartbeats.append, target_system=target_system)

    def on_messages(self, msgs: list[Any], recv_ns: int) -> None:
        self.batches.append((msgs, recv_ns))

    @property
    def messages(self) -> list[Any]:
        return [m for batch, _ in self.batches for m in batch]


def test_recorded_ardupilot_bytes_reach_the_twin_in_order_as_one_batch_a_read() -> None:
    reference = MavCodec().feed(WIRE)
    rig = Rig()
    rig.inbound.receive(WIRE)
    assert len(rig.batches) == 1 and rig.batches[0][1] > 0
    assert rig.inbound.target_system == 1  # the recording's autopilot, named by its first HEARTBEAT
    # System 1's frames count from its autopilot's first HEARTBEAT on (the recording starts before it).
    first = next(i for i, m in enumerate(reference) if m._type == "HEARTBEAT" and m._header.srcComponent == 1)
    assert first > 0
    want = [(m._type, m._header.seq) for m in reference[first:] if m._header.srcSystem == 1]
    assert [(m._type, m._header.seq) for m in rig.messages] == want and len(want) > 100
    assert set(rig.inbound.last_seen_mono) == {m._type for m in rig.messages}
    assert len(rig.heartbeats) == sum(1 for m in reference if m._type == "HEARTBEAT" and m._header.srcComponent == 1)


def test_the_first_autopilot_heartbeat_names_the_vehicle_and_nothing_before_it_counts() -> None:
    rig = Rig()
    rig.inbound.receive(_from(7, _attitude(1)))  # no vehicle named yet: not the vehicle's
    assert rig.batches == [] and rig.heartbeats == []
    rig.inbound.receive(_from(255, _gcs_heartbeat(), compid=190))  # a ground station names nothing
    assert rig.inbound.target_system == 0
    rig.inbound.receive(_from(7, _autopilot_heartbeat()) + _from(7, _attitude(2)))
    assert rig.inbound.target_system == 7 and rig.inbound.target_component == 1
    assert [m._type for m in rig.messages] == ["HEARTBEAT", "ATTITUDE"] and len(rig.heartbeats) == 1


def test_another_systems_messages_go_to_listeners_only() -> None:
    rig = Rig(target_system=7)
    heard: list[list[Any]] = []
    rig.inbound.fan_out = heard.append
    wire = _from(8, _autopilot_heartbeat()) + _from(7, _attitude(3)) + _from(8, _attitude(4))
    rig.inbound.receive(wire)
    assert [m.time_boot_ms for m in rig.messages] == [3]
    assert rig.heartbeats == []  # system 8's autopilot does not keep system 7's link up
    assert rig.inbound.target_system == 7  # a given system id is never replaced
    assert [[m._header.srcSystem for m in batch] for batch in heard] == [[8, 7, 8]]
    assert rig.inbound.last_seen_mono.keys() == {"ATTITUDE"}


def test_a_tap_sees_the_reads_bytes_before_decoding() -> None:
    rig = Rig()
    seen: list[bytes] = []
    rig.inbound.tap = seen.append
    halves = WIRE[:100], WIRE[100:300]
    for part in halves:
        rig.inbound.receive(part)
    assert seen == list(halves)
    rig.inbound.tap = None
    rig.inbound.receive(WIRE[300:400])
    assert len(seen) == 2


def test_a_handlers_error_is_raised_by_receive_and_logged_by_the_read_callback() -> None:
    def broken(msgs: list[Any], recv_ns: int) -> None:
        raise RuntimeError("twin bug")

    inbound = Inbound(name="v9", codec=MavCodec(), on_messages=broken, on_heartbeat=lambda now: None)
    with pytest.raises(RuntimeError, match="twin bug"):
        inbound.receive(_from(1, _autopilot_heartbeat()))
    with structlog.testing.capture_logs() as logs:
        inbound.on_bytes(_from(1, _attitude(5)))  # the transport's callback: logged, not raised
    assert [(e["event"], e["vehicle"]) for e in logs] == [("link_dispatch_failed", "v9")]
    assert inbound.codec.stats.messages_in == 2  # the codec went on decoding
