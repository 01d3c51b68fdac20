"""Fault injection `reject_next`: force the MAV_RESULT of the next commands of one MAV_CMD.

The sans-IO tests feed decoded COMMAND_LONGs straight into a `VehicleModel`;
the last one goes over real TCP, the way a gateway meets the fault.
"""

from __future__ import annotations

from typing import Any

import pytest
from pymavlink.dialects.v20 import ardupilotmega as M

from mavjet.sim.fleet import SimFleet
from mavjet.sim.model import VehicleModel, VehicleOptions
from mavjet.sim.modes import ARDUPILOT
from tests.support.sim import MavClient, ready

SET_MODE = M.MAV_CMD_DO_SET_MODE
ARM = M.MAV_CMD_COMPONENT_ARM_DISARM
GCS = (255, 190)
GUIDED = 4


def model() -> VehicleModel:
    # boot_s=0: past ArduPilot's BOOT window at once (arming then would be refused as "not initialised")
    return VehicleModel(
        VehicleOptions(sysid=1, flavour=ARDUPILOT, lat_deg=-35.36, lon_deg=149.16, ground_amsl_m=584.0, boot_s=0.0)
    )


def command(v: VehicleModel, cmd: int, *params: float, confirmation: int = 0, wall: float = 0.0) -> int:
    """Send one COMMAND_LONG to the model; return the result of the COMMAND_ACK it answered with."""
    p = [*params, *([0.0] * (7 - len(params)))]
    msg = M.MAVLink_command_long_message(1, 1, cmd, confirmation, *p)
    v.out.clear()
    v.handle(msg, GCS, v.now, wall)
    acks: list[Any] = [m for m in v.out if not isinstance(m, tuple) and m.get_type() == "COMMAND_ACK"]
    assert len(acks) == 1 and acks[0].command == cmd
    assert (acks[0].target_system, acks[0].target_component) == GCS
    return int(acks[0].result)


def test_forced_results_are_answered_in_order_and_not_executed() -> None:
    v = model()
    v.reject_next(SET_MODE, M.MAV_RESULT_TEMPORARILY_REJECTED, 2)
    v.reject_next(SET_MODE, M.MAV_RESULT_UNSUPPORTED)
    assert v.forced_pending(SET_MODE) == 3
    custom = M.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED
    got = [command(v, SET_MODE, custom, 2) for _ in range(4)]  # ALT_HOLD needs no GPS
    assert got == [M.MAV_RESULT_TEMPORARILY_REJECTED] * 2 + [M.MAV_RESULT_UNSUPPORTED, M.MAV_RESULT_ACCEPTED]
    assert v.mode == "ALT_HOLD"  # only the fourth was acted on
    assert [(e.result, e.executed) for e in v.executions] == [
        (M.MAV_RESULT_TEMPORARILY_REJECTED, False), (M.MAV_RESULT_TEMPORARILY_REJECTED, False),
        (M.MAV_RESULT_UNSUPPORTED, False), (M.MAV_RESULT_ACCEPTED, True),
    ]  # fmt: skip
    assert v.forced_pending(SET_MODE) == 0
    assert v.stats.forced_results == 3


def test_only_the_named_command_is_forced() -> None:
    v = model()
    v.reject_next(ARM, M.MAV_RESULT_DENIED)
    custom = M.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED
    assert command(v, SET_MODE, custom, 2) == M.MAV_RESULT_ACCEPTED
    assert v.forced_pending(ARM) == 1
    assert command(v, ARM, 1, 21196) == M.MAV_RESULT_DENIED  # even a forced arm is refused
    assert not v.armed
    assert command(v, ARM, 1, 21196) == M.MAV_RESULT_ACCEPTED
    assert v.armed


def test_a_retransmission_of_a_forced_command_gets_the_same_answer_without_using_one_up() -> None:
    v = model()
    v.reject_next(SET_MODE, M.MAV_RESULT_TEMPORARILY_REJECTED, 2)
    custom = M.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED
    assert command(v, SET_MODE, custom, 2, wall=10.0) == M.MAV_RESULT_TEMPORARILY_REJECTED
    # The ACK was lost: the ground station retransmits with confirmation incremented.
    assert command(v, SET_MODE, custom, 2, confirmation=1, wall=10.5) == M.MAV_RESULT_TEMPORARILY_REJECTED
    assert v.forced_pending(SET_MODE) == 1
    assert v.stats.retransmits_recognised == 1
    assert len(v.executions) == 1


@pytest.mark.parametrize(
    ("result", "count", "needle"),
    [
        (M.MAV_RESULT_IN_PROGRESS, 1, "not IN_PROGRESS"),
        (M.MAV_RESULT_ENUM_END, 1, "final MAV_RESULT"),
        (-1, 1, "final MAV_RESULT"),
        (M.MAV_RESULT_DENIED, 0, "count must be at least 1"),
    ],
)
def test_reject_next_refuses_bad_arguments(result: int, count: int, needle: str) -> None:
    v = model()
    with pytest.raises(ValueError, match=needle):
        v.reject_next(SET_MODE, result, count)
    assert v.forced_pending(SET_MODE) == 0


async def test_reject_next_over_tcp(fleet: SimFleet, gcs: MavClient) -> None:
    v = fleet.vehicles[0]
    await ready(fleet)
    v.reject_next(SET_MODE, M.MAV_RESULT_TEMPORARILY_REJECTED)
    assert (await gcs.set_mode(v.sysid, GUIDED)).result == M.MAV_RESULT_TEMPORARILY_REJECTED
    assert v.mode == "STABILIZE"
    assert (await gcs.set_mode(v.sysid, GUIDED)).result == M.MAV_RESULT_ACCEPTED
    assert v.mode == "GUIDED"
    runs = [(e.result, e.executed) for e in v.executions if e.command == SET_MODE]
    assert runs == [(M.MAV_RESULT_TEMPORARILY_REJECTED, False), (M.MAV_RESULT_ACCEPTED, True)]
