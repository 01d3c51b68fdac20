"""The gateway's state digest (gateway/publish/digest.py), on a real server with a simulated vehicle.

The newest `status` and `position` of the vehicle, and a link record naming
the hub with the digest's period, land in TWIN_DIGEST at about `[digest] hz`,
newest per subject (deploy/central/hub/jetstream). The whole central topology
is tests/deploy/test_central_hubs.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from nats.aio.client import Client

from mavjet.contract import envelope
from mavjet.gateway.daemon import Gateway
from mavjet.gateway.publish.digest import (
    DIGEST_STREAM,
    DigestConfig,
    DigestPublisher,
    digest_subject,
)
from mavjet.ops.natsserver import NatsServer
from mavjet.ops.provision import load_definitions, provision
from mavjet.sim.fleet import SimConfig, SimFleet
from tests.support import gateway_config, running, wait_for_async

ROOT = Path(__file__).resolve().parents[2]
ENV = "test"


async def test_the_digest_holds_the_newest_chosen_channels_and_the_hub(
    nc: Client, nats_server: NatsServer, tmp_path: Path,
) -> None:
    js = nc.jetstream()
    await provision(js, load_definitions(ROOT / "deploy/central/hub/jetstream", env=ENV, replicas=1))
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=5.0)) as fleet:
        cfg = gateway_config(nats_server.url, fleet.endpoints, tmp_path / "state", track_hz=0, ownership=False,
                             digest=DigestConfig(hz=1.0, channels=("status", "position"), hub="hub-x"))
        async with running(Gateway(cfg)) as gw:
            (svc,) = [s for s in gw.services if isinstance(s, DigestPublisher)]

            async def three() -> bool:
                info = await js.stream_info(DIGEST_STREAM, subjects_filter=digest_subject(ENV, "VID-001", ">"))
                return len(info.state.subjects or {}) == 3 and svc.published >= 9

            await wait_for_async(three, 20, 0.2, what="status, position and link digests")
            await asyncio.sleep(0.2)
    info = await js.stream_info(DIGEST_STREAM, subjects_filter=digest_subject(ENV, "*", ">"))
    assert info.state.subjects == {digest_subject(ENV, "VID-001", ch): 1 for ch in ("status", "position", "link")}
    link = envelope.unpack((await js.get_last_msg(DIGEST_STREAM, digest_subject(ENV, "VID-001", "link"))).data or b"")
    assert (link.data["hub"], link.data["period_s"], link.data["gateway"]) == ("hub-x", 1.0, cfg.instance)
    status = envelope.unpack((await js.get_last_msg(DIGEST_STREAM, digest_subject(ENV, "VID-001", "status"))).data
                             or b"")
    assert status.vid == "VID-001" and "mode" in status.data
    assert svc.errors == 0
