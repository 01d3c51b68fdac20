"""Reasons from the vehicle: the status texts of a refused command's window go into its cmd_result detail."""

from __future__ import annotations

from pathlib import Path

from nats.aio.client import Client

from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.gateway.commands.actions import reason_texts
from mavjet.gateway.twin.telemetry import Event
from mavjet.ops.natsserver import NatsServer
from mavjet.sim.fleet import SimConfig
from tests.support.commands import command_rig
from tests.support.wait import wait_for

PREFIXES = ("PreArm:", "Arm:", "Disarm:")


def _text(text: str, count: int = 1, *, internal: bool = False) -> Event:
    return Event("statustext", 0, {"severity": 2, "text": text, "count": count}, "", internal=internal)


def test_reason_texts_are_distinct_ordered_and_filtered() -> None:
    events = [
        _text("PreArm: Need Position Estimate"),
        _text("Mode change to AUTO failed: no mission"),  # not an arming reason
        Event("heartbeat", 0, {"text": "Arm: not a status text"}, ""),
        _text("PreArm: Need Position Estimate", internal=True),  # a repeat the stream only counts
        _text("Arm: Need Position Estimate"),
    ]
    assert reason_texts(events, PREFIXES) == ["PreArm: Need Position Estimate", "Arm: Need Position Estimate"]
    assert reason_texts([_text(f"Arm: check {i}") for i in range(9)], PREFIXES) == [f"Arm: check {i}" for i in range(4)]


async def test_refused_arm_names_the_vehicles_reason(provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    sim = SimConfig(vehicles=1, base_port=0, speedup=5.0, ekf_settle_s=1e6)  # the EKF never settles
    async with command_rig(provisioned, nats_server.url, tmp_path / "state", sim=sim) as rig:
        v = rig.vehicle("VID-001")
        await wait_for(lambda: v.gps_fix, timeout_s=10)
        want = "arm rejected: Arm: EKF3 still initialising"  # ArduPilot: only "Arm: ..." after the ACK
        for _ in range(2):  # the second time the PreArm line is a collapsed repeat in the event stream
            r = await rig.call("VID-001", "arm")
            assert (r.result, r.mav_result) == ("failed", mavlink2.MAV_RESULT_FAILED), r
            assert r.detail == want, r.detail
        assert not v.armed
        # A refusal without any text keeps the MAV_RESULT as its detail.
        v.reject_next(mavlink2.MAV_CMD_COMPONENT_ARM_DISARM, mavlink2.MAV_RESULT_DENIED)
        r = await rig.call("VID-001", "arm")
        assert (r.result, r.detail) == ("rejected", "vehicle answered denied"), r
