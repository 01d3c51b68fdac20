"""Parameters on PX4: INT32 values travel bytewise (mavlink_parameters.cpp), never as a cast float."""

from __future__ import annotations

from pathlib import Path

from nats.aio.client import Client

from mavjet.drivers.mavlink.params import ParamEncoding, encoding_for
from mavjet.ops.natsserver import NatsServer
from mavjet.sim.fleet import SimConfig
from tests.support.commands import command_rig
from tests.support.wait import wait_for

VID = "VID-001"


def test_the_encoding_follows_the_flavour() -> None:
    assert encoding_for("px4") is ParamEncoding.BYTEWISE
    assert encoding_for("ardupilot") is ParamEncoding.CAST and encoding_for(None) is ParamEncoding.CAST


async def test_an_int32_set_on_px4_is_stored_as_the_integer(provisioned: Client, nats_server: NatsServer,
                                                             tmp_path: Path) -> None:
    sim = SimConfig(vehicles=1, base_port=0, speedup=5.0, flavour="px4")
    async with command_rig(provisioned, nats_server.url, tmp_path / "state", sim=sim) as rig:
        await rig.link_known(VID)
        await wait_for(lambda: rig.gw.twins[VID].model.flavour == "px4", timeout_s=10)
        r = await rig.call(VID, "param_set", {"name": "RTL_ALT", "value": 2500})
        assert r.accepted and r.data["value"] == 2500.0, r
        assert rig.vehicle(VID).params["RTL_ALT"] == 2500.0  # not 1159479296, the bits of 2500.0f
        got = await rig.call(VID, "param_get", {"name": "RTL_ALT"})
        assert got.accepted and got.data["value"] == 2500.0, got
