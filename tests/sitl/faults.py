"""Link loss in the middle of a command, against the simulator and a real ArduCopter SITL alike.

The gateway reaches the vehicle through a `LinkCutter` relay that goes silent both ways right after the
third mission item of an upload has gone out, for longer than the command's deliveries can last.
"""

from __future__ import annotations

from pathlib import Path

import anyio
from nats.aio.client import Client

from mavjet.contract.subjects import BLOBS_BUCKET
from mavjet.drivers.mavlink.dialect import mavlink2
from tests.sitl.peers import Site
from tests.sitl.proxy import LinkCutter
from tests.sitl.scenarios import QGC_PLAN, gateway_on, standby, until
from tests.support.commands import TEST_COMMANDS, published_results

# Longer than TEST_COMMANDS' six deliveries take to give up on a silent link (~8 s).
OUTAGE_S = 12.0


async def link_loss_mid_command(site: Site, nc: Client, url: str, tmp: Path) -> None:
    vid = "VID-001"
    store = await nc.jetstream().object_store(BLOBS_BUCKET)
    await store.put("missions/qgc_full.plan", QGC_PLAN.read_bytes())
    async with LinkCutter(upstream=site.endpoints[0]) as relay, \
            gateway_on(nc, url, [relay.endpoint], tmp / "state") as rig, published_results(nc, vid) as published:
        await standby(rig, vid)
        twin = rig.gw.twins[vid]
        relay.cut_after(mavlink2.MAVLINK_MSG_ID_MISSION_ITEM_INT, 3, OUTAGE_S)
        cmd_id = await rig.client.publish(vid, "mission_upload", {"object": "missions/qgc_full.plan"},
                                          deadline_s=OUTAGE_S + 30)
        r = await rig.client.wait(cmd_id, OUTAGE_S + 30)
        assert relay.cuts == 1
        # docs/commands.md, Lifecycle: a delivery that loses the link is nak'd and redelivered; at max_deliver
        # the retry becomes final, `timeout` for a link outage. Never `accepted` for a half-written mission.
        assert r.result == "timeout" and "link to the vehicle is down" in r.detail, r
        assert r.data["deliveries"] == TEST_COMMANDS.max_deliver, r
        await until("link back", lambda: not relay.cut and twin.link.is_up, OUTAGE_S + 30)
        await anyio.sleep(1.0)
        mine = [d for d in published if d["cmd_id"] == cmd_id]
        assert len(mine) == 1, mine  # exactly one result, also after the link is back
        # The next command after the link returns succeeds (the vehicle had kept a partial upload).
        nxt = await rig.call(vid, "mission_upload", {"object": "missions/qgc_full.plan"}, timeout_s=90)
        assert nxt.accepted, nxt
