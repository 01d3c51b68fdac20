"""Link loss in the middle of a command, against the simulator and a real ArduCopter SITL alike.

The gateway reaches the vehicle through a `LinkCutter` relay that goes silent both ways right after the
third mission item of an upload has gone out, for longer than the command's deliveries can last.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
from nats.aio.client import Client

from mavjet.contract.subjects import BLOBS_BUCKET
from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.gateway.stores.logstore import fetch_log
from tests.sitl.peers import ARDUPILOT_NAMES, Names, Site
from tests.sitl.proxy import LinkCutter
from tests.sitl.scenarios import (
    QGC_PLAN,
    arm_when_armable,
    events_of,
    gateway_on,
    newest_log,
    set_mode_when_possible,
    standby,
    until,
)
from tests.support.commands import TEST_COMMANDS, published_results
from tests.support.gateway import ENV

# Longer than TEST_COMMANDS' six deliveries take to give up on a silent link (~8 s).
OUTAGE_S = 12.0
# Longer than the test gateway's heartbeat timeout (2 s: the link is lost mid-download) and than a log window's
# retries (10 x 0.5 s of silence: the window gives up, the download pauses and later resumes).
LOG_OUTAGE_S = 8.0


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


async def log_download_survives_a_link_drop(site: Site, nc: Client, url: str, tmp: Path, *,
                                            armable_within_s: float, names: Names = ARDUPILOT_NAMES) -> None:
    """A log download that loses the link mid-way (a relay silent both ways for longer than the heartbeat
    timeout, right after the gateway's third LOG_REQUEST_DATA) pauses, resumes at the last byte received once
    the link is back, and stores the vehicle's file byte for byte (docs/commands.md, log_download)."""
    vid = "VID-001"
    async with LinkCutter(upstream=site.endpoints[0]) as relay, \
            gateway_on(nc, url, [relay.endpoint], tmp / "state", logs=True) as rig:
        await standby(rig, vid)
        await set_mode_when_possible(rig, vid, names.guided, armable_within_s)
        await arm_when_armable(rig, vid, armable_within_s)
        assert (await rig.call(vid, "disarm")).accepted
        twin = rig.gw.twins[vid]
        await until("disarmed", lambda: twin.model.armed is False, 30)
        entry = await newest_log(rig, vid, settle_s=4.0, within_s=120)
        relay.cut_after(mavlink2.MAVLINK_MSG_ID_LOG_REQUEST_DATA, 3, LOG_OUTAGE_S)
        # `latest`, the only log (PX4 numbers logs from 0, which the command's `log` param does not take yet)
        r = await rig.call(vid, "log_download", {"log": "latest"})
        assert r.accepted and int(r.data["log_id"]) == int(entry["log_id"]), r
        finished: list[dict[str, Any]] = []
        for _ in range(300):  # bounded: 300 s
            if finished := await events_of(rig, vid, "log_downloaded"):
                break
            assert not await events_of(rig, vid, "log_download_failed"), "log_download failed"
            await anyio.sleep(1.0)
        assert finished, "log_download did not finish within 300 s"
        assert relay.cuts == 1
        done = finished[-1]
        assert done["interruptions"] >= 1, done  # it did lose the link, and went on from where it was
        held = site.log_file(0, int(entry["log_id"]))
        assert held is not None and len(held) == int(done["size_bytes"]) >= int(entry["size_bytes"])
        stored = await fetch_log(nc.jetstream(), ENV, vid, str(done["object"]).rsplit("/", 1)[-1])
        assert stored == held
