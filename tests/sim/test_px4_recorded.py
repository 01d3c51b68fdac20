"""The sim's PX4 flavour answers what a real PX4 SITL (SIH) answered in the captures of tests/fixtures/px4.

Each test sends the sim the commands of a capture (altitudes rebased from the capture's home to the sim's) and
expects the real vehicle's answer: the ACK, the text, whether it climbed, the PARAM_ERROR, the read-back form.
"""

from __future__ import annotations

import math

from mavjet.sim.missionitem import SimMissionItem
from mavjet.sim.px4form import px4_form, px4_refusal
from tests.fixtures.px4.replay import load, of_type
from tests.support.sim import M, MavClient, ready, running
from tests.support.wait import wait_for

ARM = M.MAV_CMD_COMPONENT_ARM_DISARM


async def test_takeoff_altitude_is_amsl_and_a_relative_one_does_not_climb_as_recorded() -> None:
    frames = load("takeoff_and_reposition")
    rec_home = of_type(frames, "HOME_POSITION", to_vehicle=False)[0].msg.altitude / 1000
    relative, amsl = [f.msg for f in of_type(frames, "COMMAND_LONG", to_vehicle=True) if f.msg.command == 22]
    (repo,) = [f.msg for f in of_type(frames, "COMMAND_INT", to_vehicle=True)]
    texts = [f.msg.text for f in of_type(frames, "STATUSTEXT", to_vehicle=False)]
    assert any(t.startswith("Already higher than takeoff altitude") for t in texts)  # PX4 ends texts with a tab
    async with running(flavour="px4") as fleet:
        v = fleet.vehicles[0]
        gcs = await MavClient.connect(fleet.endpoints[0])
        try:
            await ready(fleet)
            assert v.home is not None
            rebase = v.home[2] - rec_home
            assert (await gcs.command_long(v.sysid, ARM, 1)).result == M.MAV_RESULT_ACCEPTED
            i = gcs.mark()
            ack = await gcs.command_long(v.sysid, M.MAV_CMD_NAV_TAKEOFF, relative.param1, relative.param2,
                                         relative.param3, relative.param4, relative.param5, relative.param6,
                                         relative.param7)
            assert ack.result == M.MAV_RESULT_ACCEPTED  # as recorded: accepted...
            text = await gcs.recv("STATUSTEXT", since=i)
            assert (text.severity, text.text) == (M.MAV_SEVERITY_CRITICAL, "Already higher than takeoff altitude")
            assert v.mode == "AUTO.LOITER" and v.landed and v.alt_m < 0.5  # ...and never climbs
            ack = await gcs.command_long(v.sysid, M.MAV_CMD_NAV_TAKEOFF, amsl.param1, amsl.param2, amsl.param3,
                                         amsl.param4, amsl.param5, amsl.param6, amsl.param7 + rebase)
            assert ack.result == M.MAV_RESULT_ACCEPTED and v.mode == "AUTO.TAKEOFF"
            await wait_for(lambda: v.mode == "AUTO.LOITER" and not v.landed, timeout_s=20, interval_s=0.05)
            assert math.isclose(v.alt_m, amsl.param7 - rec_home, abs_tol=0.5)  # 10 m, as the real one climbed
            ack = await gcs.command_int(v.sysid, repo.command, repo.frame, repo.param1, repo.param2, repo.param3,
                                        repo.param4, repo.x, repo.y, repo.z + rebase)
            assert ack.result == M.MAV_RESULT_ACCEPTED
            await wait_for(lambda: abs(v.alt_m - (repo.z - rec_home)) < 0.5, timeout_s=20, interval_s=0.05)
        finally:
            await gcs.close()


async def test_an_unknown_parameter_is_answered_with_param_error_as_recorded() -> None:
    frames = load("param_error")
    recorded = [(f.msg.param_id, f.msg.error) for f in of_type(frames, "PARAM_ERROR", to_vehicle=False)][:2]
    async with running(flavour="px4") as fleet:
        v = fleet.vehicles[0]
        gcs = await MavClient.connect(fleet.endpoints[0])
        try:
            i = gcs.mark()
            gcs.send(M.MAVLink_param_request_read_message(v.sysid, 1, b"NOT_A_PARAM", -1))
            gcs.send(M.MAVLink_param_set_message(v.sysid, 1, b"NOT_A_PARAM", 1.0, M.MAV_PARAM_TYPE_REAL32))
            await wait_for(lambda: len(gcs.of("PARAM_ERROR", since=i)) == 2, timeout_s=5, interval_s=0.02)
            got = gcs.of("PARAM_ERROR", since=i)
            assert [(e.param_id, e.error) for e in got] == recorded == [("NOT_A_PARAM", 1)] * 2
            assert all((e.target_system, e.target_component) == (255, 190) for e in got)
            assert not gcs.of("PARAM_VALUE", since=i)
        finally:
            await gcs.close()


def test_the_sims_px4_read_back_form_is_the_recorded_one() -> None:
    """Every item of the capture's mission, fence and rally uploads, stored by the sim's PX4 form, reads back as
    the real PX4 returned it (the `current` flag aside: PX4 marks its current seq, a fresh list's 0)."""
    frames = load("mission_roundtrip")
    sent: dict[tuple[int, int], SimMissionItem] = {}
    back: dict[tuple[int, int], SimMissionItem] = {}
    for f in of_type(frames, "MISSION_ITEM_INT"):
        m = f.msg
        item = SimMissionItem(seq=m.seq, frame=m.frame, command=m.command, current=m.current,
                              autocontinue=m.autocontinue, param1=m.param1, param2=m.param2, param3=m.param3,
                              param4=m.param4, x=m.x, y=m.y, z=m.z, mission_type=m.mission_type)
        (sent if f.to_vehicle else back).setdefault((m.mission_type, m.seq), item)
    assert len(back) == 12
    for key, real in back.items():
        ours = px4_form(sent[key])
        assert px4_refusal(sent[key]) is None
        fields = ("frame", "command", "autocontinue", "param1", "param2", "param3", "param4", "x", "y", "z")
        for name in fields:
            a, b = getattr(ours, name), getattr(real, name)
            assert a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)), (key, name, a, b)
    terrain = [f.msg for f in of_type(frames, "MISSION_ITEM_INT", to_vehicle=True)][-1]
    item = SimMissionItem(seq=0, frame=terrain.frame, command=terrain.command, x=terrain.x, y=terrain.y, z=terrain.z)
    assert px4_refusal(item) == M.MAV_MISSION_UNSUPPORTED_FRAME == of_type(frames, "MISSION_ACK", to_vehicle=False)[-1].msg.type
