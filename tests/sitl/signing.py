"""The signing scenario against the simulator and a real ArduCopter SITL alike.

`mavjet sign setup` provisions the key over SERIAL0 (the gateway is not running yet: SITL's SERIAL0 takes
one client). The gateway then runs with the key on SERIAL1, where ArduPilot ignores whatever is not signed
with it (SERIAL0 would accept unsigned frames: docs/signing.md), and an unsigned injector on SERIAL2 tries
to change a parameter and the mode: the vehicle ignores it, while the gateway's signed commands work.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import anyio
from nats.aio.client import Client

from mavjet.drivers.mavlink.dialect import mavlink2 as m
from mavjet.ops import sign
from tests.sitl.peers import Site
from tests.sitl.scenarios import gateway_on, set_mode_when_possible, standby
from tests.support.sim import MavClient

INJECTED_RTL_LOIT_TIME = 4321.0
# A name ArduCopter 4.7 and 4.8 both have (4.8 renamed RTL_ALT to RTL_ALT_M).
PARAM = "RTL_LOIT_TIME"
LOITER = 5  # ArduCopter custom mode


async def signed_gateway_ignores_unsigned_injector(site: Site, nc: Client, url: str, tmp: Path, *,
                                                   armable_within_s: float) -> None:
    vid = "VID-001"
    key_file = tmp / f"{vid}.key"
    assert sign.main(["keygen", str(key_file)]) == 0
    # run_cli runs its own event loop: in a thread. SITL's clock starts with this first SERIAL0 client.
    rc = await asyncio.to_thread(sign.main, ["setup", vid, "--endpoint", site.endpoints[0], "--key-file",
                                             str(key_file), "--timeout", "30"])
    assert rc == 0, "the vehicle does not sign with the key after SETUP_SIGNING"
    serial1, serial2 = await site.serial(0, 1), await site.serial(0, 2)
    async with gateway_on(nc, url, [serial1], tmp / "state", signing_key_file=key_file) as rig:
        await standby(rig, vid)  # heard at all: the vehicle's frames verify with the key
        await set_mode_when_possible(rig, vid, "GUIDED", armable_within_s)
        sysid = rig.model(vid).sysid
        injector = await MavClient.connect(serial2, compid=190)
        try:
            for _ in range(3):  # unsigned, on a link that is not SERIAL0
                injector.send(m.MAVLink_param_set_message(sysid, 1, PARAM.encode(), INJECTED_RTL_LOIT_TIME,
                                                           m.MAV_PARAM_TYPE_INT32))
                injector.send(m.MAVLink_command_long_message(sysid, 1, m.MAV_CMD_DO_SET_MODE, 0,
                                                             m.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED, LOITER, 0, 0, 0, 0, 0))
                await anyio.sleep(0.5)
            await anyio.sleep(1.0)
        finally:
            await injector.close()
        got = await rig.call(vid, "param_get", {"name": PARAM})
        assert got.accepted and got.data["value"] != INJECTED_RTL_LOIT_TIME, got
        assert rig.model(vid).mode == "GUIDED", rig.model(vid).mode
        # The gateway's signed commands are obeyed.
        assert (await rig.call(vid, "param_set", {"name": PARAM, "value": 1800.0})).accepted
        got = await rig.call(vid, "param_get", {"name": PARAM})
        assert got.accepted and got.data["value"] == 1800.0, got
        assert (await rig.call(vid, "set_mode", {"mode": "LOITER"})).accepted
        assert rig.gw.twins[vid].link.is_up
