"""A flight's track on a companion behind a leaf node: live to the hub, and kept by the gateway while the uplink is cut.

The companion's nats-server (deploy/companion/leaf.conf, its own JetStream
domain) has only its local TWIN_EVENTS; track subjects are not denied on its
leaf remote, so the gateway's track samples reach the hub's TWIN_TRACKS
live, and their acks come back the same way. While the uplink is cut the
hub's stream has no interest on the companion: each publish fails at once
(no responders), and the samples must wait in the gateway's track spool and
go out, in order and once each, when the link returns (docs/analytics.md,
"Tracks"). Real peers: two nats-servers, the TCP proxy of test_leafnode.py
that cuts the link, a simulated vehicle flying, and the gateway in process.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest

from mavjet.contract.natsconn import open_client
from mavjet.contract.subjects import TRACKS_STREAM
from mavjet.contract.tracks import track_msg_id
from mavjet.drivers.mavlink.dialect import mavlink2 as m
from mavjet.gateway.daemon import Gateway
from mavjet.gateway.shadow.config import ShadowConfig
from mavjet.gateway.stores.recorder import TrackRecorder
from mavjet.ops.natsserver import NatsServer
from mavjet.ops.provision import DEFINITIONS_DIR, load_definitions, provision
from mavjet.sim.fleet import SimConfig, SimFleet
from tests.deploy.test_leafnode import COMPANION, Proxy, hub, leaf, proxy  # noqa: F401 - the fixtures
from tests.gateway.test_recorder import _arm, _command, _ready_to_arm, read_track
from tests.support import gateway_config, running, wait_for, wait_for_async

HZ = 2.0
CUT_S = 6.0


async def _hub_count(hub_nc_url: str) -> int:
    nc = await open_client(hub_nc_url, connect_timeout=2)
    try:
        return int((await nc.jetstream().stream_info(TRACKS_STREAM)).state.messages)
    finally:
        await nc.close()


@pytest.mark.waits  # a flight and a cut link, mostly waiting: `make test` runs it beside the rest
@pytest.mark.timeout(240)
async def test_track_samples_wait_in_the_spool_while_the_uplink_is_cut_and_reach_the_hub_once_in_order(
    hub: tuple[NatsServer, int], proxy: Proxy, leaf: NatsServer, tmp_path: Path,  # noqa: F811 - fixtures
) -> None:
    hub_url = hub[0].url
    hub_nc = await open_client(hub_url, connect_timeout=2)
    leaf_nc = await open_client(leaf.url, connect_timeout=2)
    try:
        await provision(hub_nc.jetstream(), load_definitions(DEFINITIONS_DIR, env="test", replicas=1))
        await provision(leaf_nc.jetstream(), load_definitions(COMPANION / "jetstream", env="test", replicas=1))
    finally:
        await leaf_nc.close()
        await hub_nc.close()
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=5.0)) as fleet:
        v = fleet.vehicles[0]
        # The companion's gateway talks to its leaf only; the shadow's bucket lives in the hub's domain, and
        # so would its lease: alone with its vehicle here (one lease across the leaf: tests/ownership/test_leaf_owner.py).
        cfg = gateway_config(leaf.url, fleet.endpoints, tmp_path / "state", track_hz=HZ,
                             shadow=ShadowConfig(enabled=False), ownership=False)
        async with running(Gateway(cfg)) as gw:
            (rec,) = [s for s in gw.services if isinstance(s, TrackRecorder)]
            await _ready_to_arm(gw, v)
            await wait_for_async(lambda: _arm(gw), timeout_s=20)
            await _command(gw, m.MAV_CMD_NAV_TAKEOFF, 0, 0, 0, 0, 0, 0, 10)
            await wait_for(lambda: v.alt_m > 8.0, 30)
            # Linked: samples reach the hub's stream through the leaf, live.
            for _ in range(60):  # bounded: 30 s
                if await _hub_count(hub_url) >= 3:
                    break
                await asyncio.sleep(0.5)
            assert await _hub_count(hub_url) >= 3, "no track sample reached the hub through the leaf"
            await proxy.cut()
            await asyncio.sleep(1.0)  # what was in flight settles
            at_cut, spooled_before = await _hub_count(hub_url), rec.samples
            await asyncio.sleep(CUT_S)
            assert await _hub_count(hub_url) == at_cut, "the hub received samples while the uplink was cut"
            assert rec.samples >= spooled_before + CUT_S * HZ * 0.5  # the gateway kept recording
            assert rec.spool.depth > 0 and gw.twins["VID-001"].link.is_up
            await proxy.start()
            await _command(gw, m.MAV_CMD_NAV_LAND)
            await wait_for(lambda: not v.armed, 60)
            await wait_for(lambda: not gw.twins["VID-001"].model.armed, 10)
            taken = rec.samples
            await wait_for(lambda: rec.spool.depth == 0, 60)
    nc = await open_client(hub_url, connect_timeout=2)
    try:
        track = await read_track(nc, "VID-001")
    finally:
        await nc.close()
    times = [t for t, _, _ in track]
    assert len(track) == taken, (len(track), taken)  # every sample, once
    assert times == sorted(times) and len(set(times)) == len(times)
    gaps_s = [(b - a) / 1e9 for a, b in itertools.pairwise(times)]
    assert max(gaps_s) < 4 / HZ, max(gaps_s)  # no hole where the uplink was cut
    assert track[-1][1]["armed"] is False and all(i == track_msg_id("VID-001", t) for t, _, i in track)
