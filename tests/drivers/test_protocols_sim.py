"""Command, mission and parameter runners over TCP against a simulated ArduPilot."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import anyio
import pytest

from mavjet.contract.errors import CommandRejected, LinkError
from mavjet.drivers.mavlink.command import CommandResult
from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.drivers.mavlink.fence import geofence_from_dict
from mavjet.drivers.mavlink.link import LinkConfig, MavlinkLink
from mavjet.drivers.mavlink.mission import FENCE, MISSION, RALLY, MissionItem
from mavjet.drivers.mavlink.params import REAL32, ParamError, ParamTimeout
from mavjet.drivers.mavlink.plan import digest, parse_plan
from mavjet.drivers.mavlink.runner import execute_command, read_param, run_command, set_param
from mavjet.drivers.mavlink.transfers import (
    apply_geofence,
    clear_mission,
    download_mission,
    upload_and_verify,
    upload_mission,
)
from mavjet.drivers.mavlink.transport import Endpoint
from mavjet.drivers.mavlink.vehiclesession import VehicleSession
from mavjet.sim.fleet import SimConfig
from tests.drivers.simlink import FAST, LOSSY, sim_link, wait_for

ARM = mavlink2.MAV_CMD_COMPONENT_ARM_DISARM
DO_SET_MODE = mavlink2.MAV_CMD_DO_SET_MODE
GUIDED = 4  # ArduCopter custom mode
CUSTOM = mavlink2.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED
DEMO = Path(__file__).resolve().parents[2] / "sim" / "plans" / "demo.plan"


def executions(v: object, command: int) -> list[object]:
    return [e for e in v.executions if e.command == command]  # type: ignore[attr-defined]


async def test_command_results_accepted_denied_unsupported_failed() -> None:
    async with sim_link() as (link, v):
        await wait_for(lambda: bool(v.ekf_ok), 20.0, "EKF to settle")  # GUIDED needs a position
        ok = await run_command(link, DO_SET_MODE, (CUSTOM, GUIDED), config=FAST)
        assert ok.accepted and ok.mav_result == mavlink2.MAV_RESULT_ACCEPTED and ok.attempts == 1
        assert ok.latency_ms > 0
        assert v.mode == "GUIDED"

        # COMMAND_INT with an impossible position: denied
        denied = await execute_command(
            link, mavlink2.MAV_CMD_DO_REPOSITION, (-1, 0, 0, 0, 0.0, 0.0, 20), use_int=True, config=FAST
        )
        assert denied.result is CommandResult.REJECTED and denied.mav_result == mavlink2.MAV_RESULT_DENIED
        assert executions(v, mavlink2.MAV_CMD_DO_REPOSITION)[-1].frame == mavlink2.MAV_FRAME_GLOBAL_RELATIVE_ALT  # type: ignore[attr-defined]

        with pytest.raises(CommandRejected) as err:
            await run_command(link, mavlink2.MAV_CMD_USER_1, config=FAST)
        assert err.value.result == mavlink2.MAV_RESULT_UNSUPPORTED

        # takeoff while disarmed: failed (ArduPilot's answer)
        failed = await execute_command(link, mavlink2.MAV_CMD_NAV_TAKEOFF, (0, 0, 0, 0, 0, 0, 10), config=FAST)
        assert failed.mav_result == mavlink2.MAV_RESULT_FAILED and failed.attempts == 1


async def test_arm_refused_before_ekf_then_accepted() -> None:
    cfg = SimConfig(vehicles=1, base_port=0, speedup=5.0, ekf_settle_s=15.0)
    async with sim_link(cfg) as (link, v):
        assert not v.ekf_ok
        with pytest.raises(CommandRejected) as err:
            await run_command(link, ARM, (1,), config=FAST)
        assert err.value.result == mavlink2.MAV_RESULT_FAILED
        assert any(text.startswith("Arm: ") for _, text in v.statustexts)  # ArduPilot: "Arm: <reason>" after the ACK
        assert not v.armed
        await wait_for(lambda: bool(v.ekf_ok), 20.0, "EKF to settle")
        out = await run_command(link, ARM, (1,), config=FAST)
        assert out.accepted and v.armed


async def test_arm_with_lost_ack_is_confirmed_by_heartbeat_not_resent() -> None:
    async with sim_link() as (link, v):
        await wait_for(lambda: bool(v.ekf_ok), 20.0, "EKF to settle")
        before = len(executions(v, ARM))
        v.drop_next("COMMAND_ACK", 1)
        out = await execute_command(link, ARM, (1,), config=FAST)
        assert out.accepted and out.confirmed_by == "heartbeat"
        assert out.attempts == 1  # never retransmitted
        assert len(executions(v, ARM)) == before + 1 and v.armed


async def test_disarm_lost_on_the_way_is_resent_after_state_check() -> None:
    async with sim_link() as (link, v):
        await wait_for(lambda: bool(v.ekf_ok), 20.0, "EKF to settle")
        await run_command(link, ARM, (1,), config=FAST)
        assert v.armed
        v.drop_next("COMMAND_LONG", 1, incoming=True)  # the vehicle never hears the first DISARM
        out = await execute_command(link, ARM, (0,), config=FAST)
        assert out.accepted and out.confirmed_by == "ack"
        assert out.attempts == 2
        disarms = [e for e in executions(v, ARM) if e.params[0] == 0.0]  # type: ignore[attr-defined]
        assert len(disarms) == 1 and disarms[0].confirmation == 1  # type: ignore[attr-defined]
        assert not v.armed


async def test_lost_ack_of_plain_command_is_retried_with_confirmation_and_not_reexecuted() -> None:
    async with sim_link() as (link, v):
        await wait_for(lambda: bool(v.ekf_ok), 20.0, "EKF to settle")
        v.drop_next("COMMAND_ACK", 1)
        out = await run_command(link, DO_SET_MODE, (CUSTOM, GUIDED), config=FAST)
        assert out.accepted and out.attempts == 2
        assert len(executions(v, DO_SET_MODE)) == 1  # the retry was recognised, not acted on again
        assert v.stats.retransmits_recognised >= 1


async def test_in_progress_takeoff_reports_progress() -> None:
    cfg = SimConfig(
        vehicles=1, base_port=0, speedup=5.0, in_progress_commands=frozenset({mavlink2.MAV_CMD_NAV_TAKEOFF})
    )
    async with sim_link(cfg) as (link, v):
        await wait_for(lambda: bool(v.ekf_ok), 20.0, "EKF to settle")
        await run_command(link, DO_SET_MODE, (CUSTOM, GUIDED), config=FAST)
        await run_command(link, ARM, (1,), config=FAST)
        seen: list[int | None] = []
        out = await execute_command(
            link, mavlink2.MAV_CMD_NAV_TAKEOFF, (0, 0, 0, 0, 0, 0, 12), config=FAST, on_progress=seen.append
        )
        assert out.accepted and out.attempts == 1 and out.progress == 100
        assert seen and seen[0] == 0  # the first answer is IN_PROGRESS with 0 %
        assert all(p is not None and 0 <= p < 100 for p in seen)
        assert v.alt_m > 10.0


async def test_mission_fence_rally_upload_and_download_digests_match() -> None:
    plan = parse_plan(DEMO.read_text())
    async with sim_link() as (link, v):
        d = await upload_and_verify(link, plan.mission, MISSION, config=FAST)
        assert d == plan.mission_digest
        stored = v.missions.items(MISSION)
        assert len(stored) == len(plan.mission)
        assert [it.command for it in stored[1:]] == [it.command for it in plan.mission[1:]]
        assert await upload_and_verify(link, plan.fence, FENCE, config=FAST) == digest(plan.fence)
        assert await upload_and_verify(link, plan.rally, RALLY, config=FAST) == digest(plan.rally)
        assert len(v.missions.items(FENCE)) == 5 and len(v.missions.items(RALLY)) == 1

        # a different mission changes the digest the vehicle reports
        changed = (*plan.mission[:3], replace(plan.mission[3], z=45.0), *plan.mission[4:])
        await upload_mission(link, changed, config=FAST)
        assert digest(await download_mission(link, config=FAST)) != plan.mission_digest

        await clear_mission(link, FENCE, config=FAST)
        assert await download_mission(link, FENCE, config=FAST) == []


async def test_mission_upload_survives_10_percent_loss_each_way() -> None:
    # Not 20 %: the vehicle, like ArduPilot, asks again for a lost item every 1 s and cancels the
    # upload after 8 s without progress (sim/missions.py), so an item has 8 tries. At 20 % loss each
    # way a try fails with p = 0.36 and the vehicle itself cancels ~1 item in 3,500 (0.36**8): a
    # real autopilot would too, and this test, 23 items a run, failed so about once in 150 runs. At
    # 10 % a try fails with p = 0.19: ~2e-6 an item. The retries of the ground station's side are
    # what `LOSSY` tests at 20 % (`test_params_under_loss`).
    plan = parse_plan(DEMO.read_text())
    cfg = SimConfig(vehicles=1, base_port=0, speedup=5.0, loss=0.1, loss_in=0.1)
    async with sim_link(cfg) as (link, v):
        for _ in range(2):
            assert await upload_and_verify(link, plan.mission, MISSION, config=LOSSY) == plan.mission_digest
        assert await upload_and_verify(link, plan.fence, FENCE, config=LOSSY) == digest(plan.fence)
        assert v.link.frames_lost > 0 and v.link.frames_in_lost > 0


async def test_params_set_and_read_back() -> None:
    async with sim_link() as (link, v):
        got = await read_param(link, "WPNAV_SPEED", config=FAST)
        assert got.value == 500.0 and got.param_type == REAL32 and got.count > 10

        confirmed = await set_param(link, "WPNAV_SPEED", 742.3, config=FAST)
        assert confirmed.value == pytest.approx(742.3, rel=1e-6)
        assert v.params["WPNAV_SPEED"] == pytest.approx(742.3, rel=1e-6)
        assert (await read_param(link, "WPNAV_SPEED", config=FAST)).value == pytest.approx(742.3, rel=1e-6)

        rtl = await set_param(link, "RTL_ALT", 2500, config=FAST)  # type learned by reading first
        assert rtl.param_type == mavlink2.MAV_PARAM_TYPE_INT32 and rtl.value == 2500.0
        assert v.params["RTL_ALT"] == 2500.0

        with pytest.raises(ParamError, match="integer"):
            await set_param(link, "RTL_ALT", 12.5, config=FAST)
        with pytest.raises(ParamTimeout) as err:
            await read_param(link, "NO_SUCH_PARAM", config=FAST)
        assert err.value.attempts == FAST.params.max_attempts


async def test_params_under_loss() -> None:
    cfg = SimConfig(vehicles=1, base_port=0, speedup=5.0, loss=0.2, loss_in=0.2)
    async with sim_link(cfg) as (link, v):
        for i in range(5):
            out = await set_param(link, "WPNAV_RADIUS", 100.0 + i, param_type=REAL32, config=LOSSY)
            assert out.value == 100.0 + i
        assert v.params["WPNAV_RADIUS"] == 104.0


async def test_apply_geofence() -> None:
    fence = geofence_from_dict(
        {
            "circles": [{"inclusion": True, "center": [-35.363261, 149.165230], "radius_m": 250}],
            "max_alt_m": 80,
            "action": "rtl",
        }
    )
    async with sim_link() as (link, v):
        d = await apply_geofence(link, fence, config=FAST)
        assert d == fence.digest
        assert v.params["FENCE_ENABLE"] == 1.0 and v.params["FENCE_ALT_MAX"] == 80.0
        assert v.params["FENCE_TYPE"] == 5.0
        assert len(v.missions.items(FENCE)) == 1


async def test_silent_link_times_out() -> None:
    async with sim_link() as (link, v):
        v.drop_link(30.0)  # silence both ways, TCP kept open
        out = await execute_command(link, mavlink2.MAV_CMD_USER_1, config=FAST)
        assert out.result is CommandResult.TIMEOUT and out.attempts == FAST.command.max_attempts
        assert out.mav_result is None
        with pytest.raises(ParamTimeout):
            await read_param(link, "WPNAV_SPEED", config=FAST)


async def test_closed_link_raises_link_error() -> None:
    async with sim_link() as (link, v):
        v.drop_link(30.0, close=True)
        await wait_for(lambda: not link.is_up and link.state.value == "down", 10.0, "link down")
        with pytest.raises(LinkError):
            await execute_command(link, mavlink2.MAV_CMD_USER_1, config=FAST)


async def test_cancelling_a_runner_propagates_promptly() -> None:
    async with sim_link() as (link, v):
        v.drop_link(30.0)
        started = anyio.current_time()
        with anyio.move_on_after(0.3) as scope:
            await upload_mission(link, parse_plan(DEMO.read_text()).mission, config=FAST)
        assert scope.cancelled_caught
        assert anyio.current_time() - started < 2.0


async def test_concurrent_mission_transfers_on_one_link_are_serialised() -> None:
    plan = parse_plan(DEMO.read_text())
    other = (*plan.mission[:3], replace(plan.mission[3], z=45.0), *plan.mission[4:])
    results: dict[str, str] = {}

    async def put(key: str, items: tuple[MissionItem, ...], mission_type: int = MISSION) -> None:
        results[key] = await session.upload_and_verify(items, mission_type)

    async with sim_link() as (link, _v):
        session = VehicleSession(link, protocols=FAST)  # owns the vehicle's transfer lock
        async with anyio.create_task_group() as tg:
            tg.start_soon(put, "a", plan.mission)
            tg.start_soon(put, "b", other)
            tg.start_soon(put, "fence", plan.fence, FENCE)
        assert results["a"] == digest(plan.mission) and results["b"] == digest(other)
        assert results["fence"] == digest(plan.fence)
        assert digest(await download_mission(link, config=FAST)) in (results["a"], results["b"])


async def test_runner_refuses_a_link_that_has_not_identified_the_vehicle() -> None:
    link = MavlinkLink(
        name="nobody", endpoint=Endpoint.parse("tcp:127.0.0.1:9"), config=LinkConfig(), on_messages=lambda m, t: None
    )
    with pytest.raises(LinkError, match="no HEARTBEAT"):
        await execute_command(link, ARM, (1,), config=FAST)
    with pytest.raises(LinkError, match="no HEARTBEAT"):
        await read_param(link, "RTL_ALT", config=FAST)
