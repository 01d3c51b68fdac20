"""`VehicleSession` (the per-vehicle Session) against simulated ArduPilot and PX4 vehicles over TCP."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from mavjet.contract.errors import CommandRejected
from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.drivers.mavlink.link import LinkConfig, LinkState, MavlinkLink
from mavjet.drivers.mavlink.mission import FENCE, MISSION
from mavjet.drivers.mavlink.modes import UnknownMode
from mavjet.drivers.mavlink.plan import digest, parse_plan
from mavjet.drivers.mavlink.session import Session
from mavjet.drivers.mavlink.transport import Endpoint
from mavjet.drivers.mavlink.vehiclesession import VehicleSession
from mavjet.gateway.twin.telemetry import TelemetryModel
from mavjet.sim.fleet import SimConfig, SimFleet
from mavjet.sim.vehicle import SimVehicle
from tests.drivers.simlink import FAST, wait_for

DEMO = Path(__file__).resolve().parents[2] / "sim" / "plans" / "demo.plan"


@asynccontextmanager
async def sim_session(flavour: str = "ardupilot") -> AsyncIterator[tuple[Session, SimVehicle, TelemetryModel]]:
    """A sim vehicle, a link to it feeding a telemetry model, and the session over both."""
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=5.0, flavour=flavour)) as fleet:
        model = TelemetryModel(vid="veh1")

        def on_messages(msgs: list[object], recv_ns: int) -> None:
            for msg in msgs:
                model.update(msg, recv_ns)

        link = MavlinkLink(name="veh1", endpoint=Endpoint.parse(fleet.endpoints[0]),
                           config=LinkConfig(heartbeat_timeout_s=5.0), on_messages=on_messages)
        session = VehicleSession(link, protocols=FAST, flight_state=model)
        async with anyio.create_task_group() as tg:
            await tg.start(link.run)
            with anyio.fail_after(15):
                await session.wait_ready()
            try:
                yield session, fleet.vehicles[0], model
            finally:
                tg.cancel_scope.cancel()


async def test_session_state_health_and_identity() -> None:
    async with sim_session() as (session, v, _model):
        assert session.is_up and session.state is LinkState.UP and session.connects == 1
        assert session.target_system == v.sysid and session.target_component == 1
        assert session.modes is not None and session.modes.flavour.value == "ardupilot"
        assert await session.wait_heartbeat(5.0)
        await wait_for(lambda: session.health().by_type.get("GLOBAL_POSITION_INT", 0) > 3, 15, "telemetry")
        h = session.health()
        assert h.state is LinkState.UP and h.connects == 1 and h.crc_errors == 0
        assert h.heartbeat_age_s is not None and 0 <= h.heartbeat_age_s < 3
        assert h.messages_in >= sum(h.by_type.values()) > 0
        assert not session.is_airborne()

        ident = await session.autopilot_version(wait_s=2.0)
        assert ident is not None and ident["firmware"].count(".") == 2 and ident["uid"]

        msg_id = mavlink2.MAVLINK_MSG_ID_GLOBAL_POSITION_INT
        await session.set_message_rate(msg_id, 4.0)
        assert await session.read_message_rate(msg_id, wait_s=2.0) == pytest.approx(4.0, rel=0.02)


async def test_session_modes_arming_params_missions() -> None:
    async with sim_session() as (session, v, _model):
        await wait_for(lambda: bool(v.ekf_ok), 20.0, "EKF to settle")
        out = await session.set_mode("guided")
        assert out.accepted and v.mode == "GUIDED"
        with pytest.raises(UnknownMode):
            await session.set_mode("POSCTL")  # a PX4 mode on ArduPilot: refused before anything is sent
        await session.arm()
        assert v.armed
        await session.disarm()
        assert not v.armed

        pv = await session.set_param("RTL_ALT", 2500.0)
        assert pv.value == 2500.0 and (await session.read_param("RTL_ALT")).value == 2500.0

        plan = parse_plan(DEMO.read_text())
        assert await session.upload_and_verify(plan.mission) == digest(plan.mission)
        assert digest(await session.download_mission()) == digest(plan.mission)
        await session.clear_mission()
        assert len(await session.download_mission()) <= 1  # ArduPilot keeps home at seq 0
        report = await session.upload_mission(plan.fence, FENCE)
        assert report.count == len(plan.fence)


async def test_px4_set_mode_packs_main_and_sub_mode() -> None:
    async with sim_session("px4") as (session, v, model):
        assert session.modes is not None and session.modes.flavour.value == "px4"
        await wait_for(lambda: bool(v.ekf_ok), 20.0, "EKF to settle")
        await session.set_mode("AUTO.LOITER")
        await wait_for(lambda: model.mode == "AUTO.LOITER", 10.0, "HEARTBEAT to report AUTO.LOITER")
        await session.set_mode("POSCTL")
        await wait_for(lambda: model.mode == "POSCTL", 10.0, "HEARTBEAT to report POSCTL")
        assert v.mode == "POSCTL"


async def test_session_arm_is_never_forced() -> None:
    cfg_ekf_late = SimConfig(vehicles=1, base_port=0, speedup=5.0, ekf_settle_s=15.0)
    async with SimFleet(cfg_ekf_late) as fleet:
        link = MavlinkLink(name="veh1", endpoint=Endpoint.parse(fleet.endpoints[0]),
                           config=LinkConfig(heartbeat_timeout_s=5.0), on_messages=lambda m, t: None)
        session = VehicleSession(link, protocols=FAST)
        async with anyio.create_task_group() as tg:
            await tg.start(link.run)
            with anyio.fail_after(15):
                await session.wait_ready()
            with pytest.raises(CommandRejected):
                await session.arm()  # pre-arm checks refuse; the session does not override them
            assert not fleet.vehicles[0].armed
            assert not session.is_airborne() and session.modes is None  # no flight state given
            tg.cancel_scope.cancel()


async def test_px4_plain_upload_sends_no_home_and_downloads_in_mavjets_layout() -> None:
    # upload_mission is the inverse of download_mission on PX4 too: the home (seq 0) is not sent.
    plan = parse_plan(DEMO.read_text())
    async with sim_session("px4") as (session, v, _model):
        report = await session.upload_mission(plan.mission)
        stored = v.missions.items(MISSION)
        assert report.count == len(plan.mission) - 1 == len(stored)
        assert (stored[0].seq, stored[0].command) == (0, plan.mission[1].command)
        back = await session.download_mission()
        assert [it.seq for it in back] == [it.seq for it in plan.mission]


async def test_a_slow_stream_is_not_asked_for_again_while_it_flows() -> None:
    """HOME_POSITION comes every 5 s: a 1 s staleness bound must not re-request it at every check."""
    requested: list[str] = []
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=1.0)) as fleet:
        cfg = LinkConfig(heartbeat_timeout_s=3.0, stream_check_interval_s=0.2, stream_stale_s=1.0,
                         streams_hz={"ATTITUDE": 10.0, "HOME_POSITION": 0.2})
        link = MavlinkLink(name="veh1", endpoint=Endpoint.parse(fleet.endpoints[0]), config=cfg,
                           on_messages=lambda msgs, recv_ns: None)
        send = link.send

        async def spy(msg: Any) -> None:
            if msg.get_type() == "COMMAND_LONG" and msg.command == mavlink2.MAV_CMD_SET_MESSAGE_INTERVAL:
                requested.append(mavlink2.mavlink_map[int(msg.param1)].msgname)
            await send(msg)

        link.send = spy  # type: ignore[method-assign]
        async with anyio.create_task_group() as tg:
            await tg.start(link.run)
            with anyio.fail_after(15):
                await link.wait_ready()
            await anyio.sleep(7.0)  # a 1 s bound checked every 0.2 s: the old rule asked ~6 times more
            tg.cancel_scope.cancel()
    assert requested.count("HOME_POSITION") == 1, requested
    assert requested.count("ATTITUDE") == 1, requested
