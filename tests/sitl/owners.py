"""Two gateways for one autopilot, one on SERIAL0 and one on SERIAL1: one owner acts, the other takes over.

The owner is crashed (its tasks cancelled: no release, its lease goes stale as a SIGKILLed process's would);
the standby, on the other serial port, owns the vehicle within TTL + 2 s and its commands reach the autopilot.
"""

from __future__ import annotations

import time
from pathlib import Path

import anyio
from nats.aio.client import Client

from mavjet.ops.client import CommandClient
from tests.ownership.support import Crashable, command_gateway, owns, sees_owner
from tests.sitl.peers import Names, Site
from tests.sitl.scenarios import TEST_COMMANDS, Rig, set_mode_when_possible, standby
from tests.support.gateway import ENV, running
from tests.support.wait import wait_for

VID = "VID-001"


async def two_gateways_one_owner(site: Site, nc: Client, url: str, tmp: Path, names: Names) -> None:
    a, sa = command_gateway(url, [site.endpoints[0]], tmp / "a", "gw-serial0", commands=TEST_COMMANDS)
    owner = Crashable(a)
    async with CommandClient(nc, ENV, issuer="pytest-sitl") as client, anyio.create_task_group() as tg:
        tg.start_soon(owner.run)
        await wait_for(lambda: owns(a, VID), timeout_s=60)
        # SERIAL1 opens once a client is on SERIAL0 (SITL), so the standby comes second.
        b, sb = command_gateway(url, [await site.serial(0, 1)], tmp / "b", "gw-serial1", commands=TEST_COMMANDS)
        async with running(b):
            await wait_for(lambda: sees_owner(b, a, VID), timeout_s=30)
            rig_a = Rig(gw=a, client=client, nc=nc, vids=[VID])
            await standby(rig_a, VID)
            await wait_for(lambda: b.twins[VID].link.is_up and b.twins[VID].model.armed is not None, timeout_s=60)
            await set_mode_when_possible(rig_a, VID, names.other_mode, within_s=60)
            await set_mode_when_possible(rig_a, VID, names.guided, within_s=60)
            # The owner did it all; the standby, decoding the same vehicle on SERIAL1, neither pulled nor sent.
            assert sa.lanes[VID].executor.handled >= 2
            assert VID not in sb.lanes or sb.lanes[VID].executor.handled == 0
            assert b.twins[VID].link.stats.refused_not_owner == 0
            await wait_for(lambda: b.twins[VID].model.mode == names.guided, timeout_s=10)  # it sees what a did
            crashed = await owner.crash()
            await wait_for(lambda: owns(b, VID), timeout_s=15)
            took_over_s = time.monotonic() - crashed
            assert took_over_s <= 7.5, took_over_s
            r = await client.call(VID, "set_mode", {"mode": names.other_mode}, timeout_s=60, deadline_s=60)
            assert r.accepted, r
            assert sb.lanes[VID].executor.handled >= 1
            await wait_for(lambda: b.twins[VID].model.mode == names.other_mode, timeout_s=10)
            print(f"{VID}: SERIAL1's gateway owned the vehicle {took_over_s:.2f} s after SERIAL0's crashed")
