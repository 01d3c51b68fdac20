"""The PX4 flavour stores items the way PX4's mavlink_mission.cpp does, and the gateway verifies them."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

from nats.aio.client import Client
from pymavlink.dialects.v20 import ardupilotmega as M

from mavjet.drivers.mavlink.mission import MISSION
from mavjet.drivers.mavlink.plan import digest, parse_plan
from mavjet.ops.natsserver import NatsServer
from mavjet.sim.fleet import SimConfig
from tests.commands.test_mission import PLAN, mission_put
from tests.sim.test_missions import download, item, upload
from tests.support.commands import command_rig, ready_to_fly
from tests.support.sim import MavClient, running
from tests.support.wait import wait_for


def _wp(seq: int, cmd: int, p: tuple[float, float, float, float], *, frame: int = 3, mtype: int = 0) -> object:
    return M.MAVLink_mission_item_int_message(1, 1, seq, frame, cmd, 0, 1, *p, -353605661, 1491652300, 30.0, mtype)


async def test_px4_read_back_form() -> None:
    async with running(flavour="px4") as fleet:
        gcs = await MavClient.connect(fleet.endpoints[0])
        try:
            sent = [
                _wp(0, M.MAV_CMD_NAV_WAYPOINT, (0, 0, 0, 0), frame=0),
                _wp(1, M.MAV_CMD_NAV_TAKEOFF, (15, 0, 0, math.nan)),
                _wp(2, M.MAV_CMD_NAV_WAYPOINT, (2, 1.5, 7, 90)),
                _wp(3, M.MAV_CMD_DO_CHANGE_SPEED, (1, 8, -1, 0), frame=2),
                _wp(4, M.MAV_CMD_NAV_LAND, (5, 0, 0, -90)),
            ]
            assert (await upload(gcs, sent))[0].type == M.MAV_MISSION_ACCEPTED
            got = await download(gcs)
            assert got[1].param1 == 0.0 and got[1].frame == M.MAV_FRAME_GLOBAL_RELATIVE_ALT_INT
            assert (got[2].param1, got[2].param2, got[2].param3) == (2.0, 1.5, 0.0)
            assert abs(got[2].param4 - 90.0) < 1e-3  # through float32 radians and back
            assert (got[3].frame, got[3].param1, got[3].param2, got[3].param3) == (2, 1.0, 8.0, -1.0)
            assert got[4].param1 == 0.0 and abs(got[4].param4 - 270.0) < 1e-3
            fence = [item(k, M.MAV_CMD_NAV_FENCE_POLYGON_VERTEX_INCLUSION, -35.36 + k * 1e-3, 149.16, p1=3, frame=0,
                          mtype=1) for k in range(3)]  # fmt: skip
            assert (await upload(gcs, fence, 1))[0].type == M.MAV_MISSION_ACCEPTED
            assert [m.autocontinue for m in await download(gcs, 1)] == [0, 0, 0]
            terrain = [sent[0], _wp(1, M.MAV_CMD_NAV_WAYPOINT, (0, 0, 0, 0), frame=10)]
            assert (await upload(gcs, terrain))[0].type == M.MAV_MISSION_UNSUPPORTED_FRAME
            assert len(await download(gcs)) == len(sent)  # the old list is kept
        finally:
            await gcs.close()


async def test_gateway_verifies_a_qgc_plan_on_px4(provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    put = await asyncio.to_thread(mission_put, nats_server.url, str(PLAN), "--name", "missions/demo.plan")
    assert put.returncode == 0, put.stderr
    plan = parse_plan(PLAN.read_bytes())
    sim = SimConfig(vehicles=1, base_port=0, speedup=5.0, flavour="px4")
    async with command_rig(provisioned, nats_server.url, tmp_path / "state", sim=sim) as rig:
        r = await rig.call("VID-001", "mission_upload", {"object": "missions/demo.plan"})
        assert r.accepted, r
        assert (r.data["count"], r.data["fence_count"], r.data["rally_count"]) == (
            len(plan.mission), len(plan.fence), len(plan.rally))
        assert r.data["digest"] == plan.mission_digest
        assert r.data["fence_enabled"] is True  # PX4: zones uploaded, no switch to set


async def test_px4_mission_has_no_home_item(provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    """On PX4 seq 0 is the first mission item (no home): the plan's first item is stored at seq 0, and the
    gateway's download, verification and digest agree with the plan's."""
    put = await asyncio.to_thread(mission_put, nats_server.url, str(PLAN), "--name", "missions/demo.plan")
    assert put.returncode == 0, put.stderr
    plan = parse_plan(PLAN.read_bytes())
    sim = SimConfig(vehicles=1, base_port=0, speedup=5.0, flavour="px4")
    async with command_rig(provisioned, nats_server.url, tmp_path / "state", sim=sim) as rig:
        v = rig.vehicle("VID-001")
        r = await rig.call("VID-001", "mission_upload", {"object": "missions/demo.plan"})
        assert r.accepted, r
        stored = v.missions.items(MISSION)
        assert len(stored) == len(plan.mission) - 1  # the home was not sent
        first = plan.mission[1]
        assert (stored[0].seq, stored[0].command, stored[0].x, stored[0].y) == (0, first.command, first.x, first.y)
        back = await rig.gw.twins["VID-001"].session.download_mission(MISSION)
        assert [it.seq for it in back] == [it.seq for it in plan.mission]
        assert digest(back) == plan.mission_digest == r.data["digest"]
        # A raw ground station sees PX4's own numbering: MISSION_COUNT without a home.
        gcs = await MavClient.connect(await v.listen_serial(1))
        try:
            got = await download(gcs)
        finally:
            await gcs.close()
        assert len(got) == len(plan.mission) - 1 and (got[0].command, got[0].x) == (first.command, first.x)


async def test_px4_flies_the_mission_from_seq_0(provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    """MISSION_ITEM_REACHED and MISSION_CURRENT use PX4's numbering: the plan's first item is seq 0."""
    put = await asyncio.to_thread(mission_put, nats_server.url, str(PLAN), "--name", "missions/demo.plan")
    assert put.returncode == 0, put.stderr
    plan = parse_plan(PLAN.read_bytes())
    sim = SimConfig(vehicles=1, base_port=0, speedup=20.0, flavour="px4")
    async with command_rig(provisioned, nats_server.url, tmp_path / "state", sim=sim) as rig:
        v = rig.vehicle("VID-001")
        assert (await rig.call("VID-001", "mission_upload", {"object": "missions/demo.plan"})).accepted
        await ready_to_fly(rig.fleet)
        for name in ("arm", "mission_start"):
            r = await rig.call("VID-001", name)
            assert r.accepted, r
        await wait_for(lambda: len(v.reached) >= 2, timeout_s=30)
        assert v.reached[0] == 0 and plan.mission[1].command == v.missions.items(MISSION)[0].command
        assert max(v.reached) <= len(plan.mission) - 2
