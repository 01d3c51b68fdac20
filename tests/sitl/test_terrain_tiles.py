"""A terrain-frame plan through the gateway against a sim vehicle that holds terrain files (sim only: a SITL without
network has none, so its side is the refusal in test_scenarios)."""

from __future__ import annotations

from pathlib import Path

import pytest
from nats.aio.client import Client

from mavjet.drivers.mavlink.mission import MISSION
from mavjet.ops.natsserver import NatsServer
from mavjet.sim.fleet import SimConfig, SimFleet
from tests.sitl import scenarios

pytestmark = pytest.mark.timeout(120)


async def test_terrain_plan_uploads_when_the_vehicle_reports_terrain_healthy(
    provisioned: Client, nats_server: NatsServer, tmp_path: Path
) -> None:
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=5.0, terrain_tiles=True)) as fleet, \
            scenarios.gateway_on(provisioned, nats_server.url, list(fleet.endpoints), tmp_path / "state") as rig:
        v = fleet.vehicles[0]
        r = await scenarios.upload_terrain_plan(rig, "VID-001")
        assert r.accepted, r
        assert r.data["count"] == 3
        frames = [it.frame for it in v.missions.items(MISSION)]
        assert frames[2] == 10  # the terrain item reached the vehicle as sent
        # And the refusal comes back as soon as the vehicle says it lacks the data (files gone).
        v.terrain.preloaded = False
        v.terrain.blocks.clear()
        r2 = await scenarios.upload_terrain_plan(rig, "VID-001", name="missions/terrain2.plan")
        assert r2.result == "rejected" and "mission.items[1]" in r2.detail, r2
