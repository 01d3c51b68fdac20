"""The demo's sortie flown through TWIN_CMD end to end."""

from __future__ import annotations

from pathlib import Path

from nats.aio.client import Client

from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.ops.natsserver import NatsServer
from mavjet.ops.sortie import SortiePlan, distance_m, fly_sortie, offset_deg, waypoints
from mavjet.sim.fleet import SimConfig
from tests.support.commands import ENV, command_rig


def test_waypoints_are_on_the_circle() -> None:
    plan = SortiePlan(radius_m=50.0, legs=4)
    wps = waypoints(-35.36, 149.16, plan)
    assert len(wps) == 4
    assert all(abs(distance_m(-35.36, 149.16, lat, lon) - 50.0) < 0.01 for lat, lon in wps)
    lat, lon = offset_deg(-35.36, 149.16, 100.0, 0.0)
    assert lon == 149.16 and abs(distance_m(-35.36, 149.16, lat, lon) - 100.0) < 1e-6


async def test_fly_sortie_through_twin_cmd(provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    sim = SimConfig(vehicles=1, base_port=0, speedup=20.0)
    async with command_rig(provisioned, nats_server.url, tmp_path / "state", sim=sim) as rig:
        plan = SortiePlan(alt_m=10.0, radius_m=20.0, step_timeout_s=40.0)
        results = await fly_sortie(provisioned, ENV, "VID-001", plan, client=rig.client)
        v = rig.vehicle("VID-001")
        assert [r.name for r in results] == ["set_mode", "arm", "takeoff", "goto", "goto", "goto", "goto", "rtl"]
        assert all(r.accepted for r in results)
        assert not v.armed and v.alt_m < 0.5
        flown = [e.command for e in v.executions if e.command in (
            mavlink2.MAV_CMD_COMPONENT_ARM_DISARM, mavlink2.MAV_CMD_NAV_TAKEOFF, mavlink2.MAV_CMD_DO_REPOSITION,
            mavlink2.MAV_CMD_NAV_RETURN_TO_LAUNCH)]
        assert flown == [mavlink2.MAV_CMD_COMPONENT_ARM_DISARM, mavlink2.MAV_CMD_NAV_TAKEOFF,
                         *[mavlink2.MAV_CMD_DO_REPOSITION] * 4, mavlink2.MAV_CMD_NAV_RETURN_TO_LAUNCH]
