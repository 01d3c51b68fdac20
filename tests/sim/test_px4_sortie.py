"""`mavjet demo --flavour px4` flies: the sortie flies PX4 in its own modes (no GUIDED) through TWIN_CMD."""

from __future__ import annotations

from pathlib import Path

from nats.aio.client import Client

from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.ops.natsserver import NatsServer
from mavjet.ops.sortie import SortiePlan, fly_sortie, start_mode
from mavjet.sim.fleet import SimConfig
from tests.support.commands import ENV, command_rig


def test_start_mode_per_flavour() -> None:
    assert start_mode("ardupilot") == "GUIDED"
    assert start_mode("px4") == "AUTO.LOITER"
    assert start_mode(None) == "GUIDED"


async def test_px4_sortie_takes_off_flies_and_lands(provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    sim = SimConfig(vehicles=1, base_port=0, speedup=20.0, flavour="px4")
    async with command_rig(provisioned, nats_server.url, tmp_path / "state", sim=sim) as rig:
        v = rig.vehicle("VID-001")
        plan = SortiePlan(alt_m=10.0, radius_m=20.0, step_timeout_s=40.0)
        results = await fly_sortie(provisioned, ENV, "VID-001", plan, client=rig.client)
        assert [r.name for r in results] == ["set_mode", "arm", "takeoff", "goto", "goto", "goto", "goto", "rtl"]
        assert all(r.accepted for r in results), [(r.name, r.result, r.detail) for r in results]
        assert not v.armed and v.alt_m < 0.5  # landed and disarmed by AUTO.RTL
        flown = [e.command for e in v.executions if e.command in (
            mavlink2.MAV_CMD_COMPONENT_ARM_DISARM, mavlink2.MAV_CMD_NAV_TAKEOFF, mavlink2.MAV_CMD_DO_REPOSITION,
            mavlink2.MAV_CMD_NAV_RETURN_TO_LAUNCH, mavlink2.MAV_CMD_DO_SET_MODE)]
        assert flown == [mavlink2.MAV_CMD_DO_SET_MODE, mavlink2.MAV_CMD_COMPONENT_ARM_DISARM,
                         mavlink2.MAV_CMD_NAV_TAKEOFF, *[mavlink2.MAV_CMD_DO_REPOSITION] * 4,
                         mavlink2.MAV_CMD_NAV_RETURN_TO_LAUNCH]
        set_mode = next(e for e in v.executions if e.command == mavlink2.MAV_CMD_DO_SET_MODE)
        assert int(set_mode.params[1]) == 4 and int(set_mode.params[2]) == 3  # PX4 main AUTO, sub LOITER
