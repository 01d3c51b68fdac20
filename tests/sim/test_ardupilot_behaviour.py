"""The sim behaves as a real ArduCopter does where it differs from the protocol documents."""

from __future__ import annotations

import math
from typing import Any

from pymavlink.dialects.v20 import ardupilotmega as M

from mavjet.sim.fleet import SimFleet
from tests.sim.test_missions import download, item, upload
from tests.support.sim import MavClient, ready, running

ARM = M.MAV_CMD_COMPONENT_ARM_DISARM
NAN = math.nan


def _raw(seq: int, frame: int, cmd: int, p: tuple[float, float, float, float], z: float, mtype: int = 0) -> Any:
    return M.MAVLink_mission_item_int_message(1, 1, seq, frame, cmd, 1 if seq == 0 else 0, 1, *p, -353605661, 1491652300, z, mtype)


async def test_items_read_back_in_ardupilot_form(fleet: SimFleet, gcs: MavClient) -> None:
    """The normalisations a real ArduCopter applied to a QGroundControl plan (mission_roundtrip)."""
    await ready(fleet)
    sent = [
        _raw(0, 0, M.MAV_CMD_NAV_WAYPOINT, (0, 0, 0, 0), 584.0),
        _raw(1, 3, M.MAV_CMD_NAV_TAKEOFF, (0, 0, 0, NAN), 30.0),
        _raw(2, 2, M.MAV_CMD_DO_CHANGE_SPEED, (1, 10, -1, 0), 0.0),
        _raw(3, 3, M.MAV_CMD_NAV_LOITER_TIME, (30, 0, 50, 0), 100.0),
        _raw(4, 3, M.MAV_CMD_NAV_LAND, (0, 0, 0, NAN), 0.0),
        _raw(5, 3, M.MAV_CMD_NAV_RETURN_TO_LAUNCH, (0, 0, 0, 0), 0.0),
    ]
    ack, _ = await upload(gcs, sent)
    assert ack.type == M.MAV_MISSION_ACCEPTED
    got = await download(gcs)
    assert got[1].param4 == 0.0 and got[4].param4 == 1.0  # NaN -> 0; NAV_LAND's yaw direction -> 1
    assert got[2].frame == 0 and got[5].frame == 0  # no location: frame 0
    assert got[3].param3 == 1.0  # LOITER_TIME direction
    assert all(m.current == 0 for m in got)
    # fence and rally items read back with autocontinue 0
    fence = [item(k, M.MAV_CMD_NAV_FENCE_POLYGON_VERTEX_INCLUSION, -35.36 + k * 1e-3, 149.16, p1=3, frame=0, mtype=1)
             for k in range(3)]  # fmt: skip
    assert (await upload(gcs, fence, 1))[0].type == M.MAV_MISSION_ACCEPTED
    assert [m.autocontinue for m in await download(gcs, 1)] == [0, 0, 0]


async def test_nan_altitude_refused_with_invalid_param7_and_not_rolled_back(fleet: SimFleet, gcs: MavClient) -> None:
    await ready(fleet)
    first = [_raw(0, 0, 16, (0, 0, 0, 0), 584.0), _raw(1, 3, 22, (0, 0, 0, 0), 30.0), _raw(2, 3, 16, (0, 0, 0, 0), 40.0)]
    assert (await upload(gcs, first))[0].type == M.MAV_MISSION_ACCEPTED
    ack, served = await upload(gcs, [_raw(0, 0, 16, (0, 0, 0, 0), 584.0), _raw(1, 0, 16, (0, 0, 0, 0), NAN)])
    assert ack.type == M.MAV_MISSION_INVALID_PARAM7 and served == [0, 1]
    got = await download(gcs)
    assert len(got) == 2 and got[1].command == M.MAV_CMD_NAV_TAKEOFF  # cut to the new count, old item kept


async def test_arm_during_boot_is_refused_with_its_text_before_the_ack() -> None:
    """boot_and_arm_refused: the ARM at 0.23 s (still BOOT) got "Arm: System not initialised" just before its ACK,
    the only refusal whose text came first."""
    async with running(boot_s=30.0) as fleet:
        gcs = await MavClient.connect(fleet.endpoints[0])
        try:
            i = gcs.mark()
            ack = await gcs.command_long(1, ARM, 1)
            assert ack.result == M.MAV_RESULT_FAILED and ack.result_param2 == 0
            seen = [m for m in gcs.messages[i:] if m.get_type() in ("STATUSTEXT", "COMMAND_ACK")]
            k = next(n for n, m in enumerate(seen) if m.get_type() == "COMMAND_ACK")
            assert k > 0 and seen[k - 1].text == "Arm: System not initialised"
            assert seen[k - 1].severity == M.MAV_SEVERITY_CRITICAL
            assert not fleet.vehicles[0].armed
        finally:
            await gcs.close()
