"""A companion's gateway (on a leaf node) and the hub's gateway for one vehicle: one lease, one owner.

Two real nats-servers: the hub (JetStream domain `hub`) and the companion started from
deploy/companion/leaf.conf (its own domain), linked through a TCP proxy the test cuts. The
companion's gateway names the hub's domain (`[nats] domain`), so its lease, commands and
shadow are the hub's; its events stay in the companion's own stream. Both gateways reach the
same sim vehicle. The companion's gateway owns the vehicle and runs a command issued at the
hub; with the uplink cut it cannot renew, stops acting, and the hub's gateway takes over (never
both at once); when the uplink returns the companion stands by.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from mavjet.contract.natsconn import open_client
from mavjet.contract.subjects import SHADOW_BUCKET, shadow_key
from mavjet.gateway.commands.consumer import CommandService
from mavjet.gateway.daemon import Gateway
from mavjet.gateway.shadow.service import ShadowService
from mavjet.ops.client import CommandClient
from mavjet.ops.natsserver import NatsServer, free_port
from mavjet.ops.provision import DEFINITIONS_DIR, load_definitions, provision
from mavjet.sim.fleet import SimConfig, SimFleet
from tests.deploy.test_leafnode import COMPANION, Proxy, companion_config
from tests.ownership.support import owns, sees_owner
from tests.support.commands import TEST_COMMANDS, ready_to_fly
from tests.support.gateway import ENV, gateway_config, running
from tests.support.wait import wait_for, wait_for_async

VID = "VID-001"
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[tuple[NatsServer, int]]:
    leaf_port = free_port()
    conf = tmp_path / "hub.conf"
    # no_advertise: else the leaf learns the hub's own leafnode address and reconnects around the proxy.
    conf.write_text("server_name: hub\njetstream { domain: hub, max_file_store: 1TB }\n"
                    f"leafnodes {{ listen: 127.0.0.1:{leaf_port}, no_advertise: true }}\n")
    srv = NatsServer(config_file=str(conf), store_dir=str(tmp_path / "hub-js"), log_file=str(tmp_path / "hub.log"))
    with srv:
        yield srv, leaf_port


def _gateway(url: str, endpoint: str, state_dir: Path, instance: str, domain: str | None) -> tuple[Gateway, CommandService]:
    cfg = gateway_config(url, [endpoint], state_dir, commands=TEST_COMMANDS)
    cfg = dataclasses.replace(cfg, instance=instance, nats=dataclasses.replace(cfg.nats, domain=domain))
    gw = Gateway(cfg)
    svc = CommandService()
    gw.services += [svc, ShadowService()]
    return gw, svc


async def test_companion_and_hub_gateways_share_one_lease_across_the_leaf(
        hub: tuple[NatsServer, int], tmp_path: Path) -> None:
    hub_srv, leaf_port = hub
    proxy = Proxy(leaf_port)
    await proxy.start()
    conf = tmp_path / "leaf.conf"
    conf.write_text(companion_config(proxy.port))
    leaf = NatsServer(config_file=str(conf), store_dir=str(tmp_path / "leaf-js"), log_file=str(tmp_path / "leaf.log"))
    hub_nc = await open_client(hub_srv.url, connect_timeout=2)
    try:
        with leaf:
            leaf_nc = await open_client(leaf.url, connect_timeout=2)
            await provision(hub_nc.jetstream(), load_definitions(DEFINITIONS_DIR, env=ENV, replicas=1, size="small"))
            # The companion keeps only its events; its lease is the hub's (no TWIN_LEASES of its own).
            defs = load_definitions(COMPANION / "jetstream", env=ENV, replicas=1)
            assert [d.name for d in defs] == ["TWIN_EVENTS"]
            await provision(leaf_nc.jetstream(), defs)
            await leaf_nc.close()
            # The hub's TWIN_EVENTS sources the companion's (deploy/companion/hub-twin-events.json): results
            # recorded on the companion reach the hub's audit trail, where the issuer reads them.
            source = json.loads((COMPANION / "hub-twin-events.json").read_text().replace("fleet.prod.", f"fleet.{ENV}."))
            resp = await hub_nc.request("$JS.API.STREAM.UPDATE.TWIN_EVENTS", json.dumps(
                {**(await hub_nc.jetstream().stream_info("TWIN_EVENTS")).config.as_dict(),
                 "sources": source["sources"]}).encode(), timeout=5)
            assert "error" not in json.loads(resp.data), resp.data
            async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=5.0)) as fleet:
                await ready_to_fly(fleet)
                ep = fleet.endpoints[0]
                comp, sc = _gateway(leaf.url, ep, tmp_path / "companion", "companion", "hub")
                hubgw, sh = _gateway(hub_srv.url, ep, tmp_path / "hub", "hub-radio", None)
                both: list[float] = []
                async with running(comp), CommandClient(hub_nc, ENV, issuer="pytest",
                                                               results_from_stream=True) as client:
                    await wait_for(lambda: owns(comp, VID), timeout_s=15)
                    async with running(hubgw), anyio.create_task_group() as tg:
                        async def overlap() -> None:
                            for _ in range(6000):  # 60 s at most
                                if owns(comp, VID) and owns(hubgw, VID):
                                    both.append(time.monotonic())
                                await anyio.sleep(0.01)

                        tg.start_soon(overlap)
                        await wait_for(lambda: sees_owner(hubgw, comp, VID), timeout_s=10)
                        # A command issued at the hub runs on the companion: its TWIN_CMD is the hub's.
                        r = await client.call(VID, "set_mode", {"mode": "GUIDED"}, timeout_s=20)
                        assert r.accepted, r
                        assert sc.lanes[VID].executor.handled >= 1 and sh.lanes[VID].executor.handled == 0
                        # Its shadow too: a desired written at the hub is applied and reported through the leaf.
                        kv = await hub_nc.jetstream().key_value(SHADOW_BUCKET)
                        rev = await kv.put(shadow_key(ENV, VID, "desired"), b'{"params": {"RTL_ALT": 4321}}')

                        async def reported() -> bool:
                            try:
                                doc = json.loads((await kv.get(shadow_key(ENV, VID, "reported"))).value or b"{}")
                            except Exception:
                                return False
                            return bool(doc.get("desired_revision") == rev and doc.get("converged"))

                        await wait_for_async(reported, timeout_s=20)
                        assert fleet.vehicles[0].params["RTL_ALT"] == 4321
                        # The uplink cut: the companion cannot renew, stops acting; the hub's gateway takes over.
                        await proxy.cut()
                        cut = time.monotonic()
                        await wait_for(lambda: not owns(comp, VID), timeout_s=6)
                        fenced_s = time.monotonic() - cut
                        await wait_for(lambda: owns(hubgw, VID), timeout_s=12)
                        took_s = time.monotonic() - cut
                        assert fenced_s < took_s
                        r = await client.call(VID, "set_mode", {"mode": "LOITER"}, timeout_s=20)
                        assert r.accepted, r
                        assert sh.lanes[VID].executor.handled >= 1
                        # The uplink back: the companion sees the hub's gateway own the vehicle and stands by.
                        await proxy.start()
                        await wait_for(lambda: sees_owner(comp, hubgw, VID), timeout_s=30)
                        assert owns(hubgw, VID) and not owns(comp, VID)
                        tg.cancel_scope.cancel()
                print(f"companion fenced {fenced_s:.2f} s after the cut, hub gateway owner after {took_s:.2f} s")
                assert both == [], "two gateways acted for the vehicle at once"
    finally:
        await hub_nc.close()
        if proxy.server is not None:
            await proxy.cut()
