"""Two links, one owner: a vehicle reached by a primary and a backup endpoint (`--backup`).

A real gateway (in this process), a real nats-server and a sim vehicle heard
twice: the primary through a relay that can go silent without closing (a
radio out of range), the backup straight to the vehicle. Pure rules of the
switch are tested on `DualPolicy` with given times.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import anyio
import anyio.lowlevel
from nats.aio.client import Client

from mavjet.contract.events import EventType
from mavjet.drivers.mavlink.duallink import DualPolicy, Side
from mavjet.drivers.mavlink.transport import Endpoint
from mavjet.gateway.commands.consumer import CommandService
from mavjet.gateway.config import CommandsConfig, VehicleConfig
from mavjet.gateway.daemon import Gateway
from mavjet.ops.client import CommandClient
from mavjet.ops.natsserver import NatsServer
from mavjet.ops.read import current_state
from mavjet.sim.fleet import SimConfig, SimFleet
from tests.ownership.support import FreezingRelay
from tests.support.commands import ready_to_fly
from tests.support.gateway import ENV, collect_events, gateway_config, running
from tests.support.wait import wait_for, wait_for_async

VID = "VID-001"
# Retries span the switch: a command whose first frames went down the silent primary ends in one result.
COMMANDS = CommandsConfig(ack_wait_s=5.0, max_deliver=6, backoff_s=(), ack_timeout_s=0.5, retries=8,
                          in_progress_timeout_s=10.0, in_progress_interval_s=1.0, nak_delay_s=0.3, fetch_timeout_s=1.0)


def test_policy_switches_after_the_primary_goes_quiet_and_back_after_it_is_steady() -> None:
    p = DualPolicy(switch_after_s=1.5, switch_back_s=5.0)
    for t in (0.0, 0.5, 1.0):
        p.on_heard(Side.PRIMARY, t)
        p.on_heard(Side.BACKUP, t)
    assert p.decide(1.2) is None  # both heard: the primary stays
    for t in (1.5, 2.0, 2.5):
        p.on_heard(Side.BACKUP, t)  # the primary is silent from 1.0
    assert p.decide(2.4) is None  # quiet 1.4 s: not yet
    assert p.decide(2.6) is Side.BACKUP
    p.switch(Side.BACKUP)
    for t in (3.0, 3.5, 4.0):
        p.on_heard(Side.PRIMARY, t)  # back, but not steady long enough
        p.on_heard(Side.BACKUP, t)
    assert p.decide(4.0) is None
    for t in (5.0, 6.0, 7.0, 8.0):
        p.on_heard(Side.PRIMARY, t)
        p.on_heard(Side.BACKUP, t)
    assert p.decide(8.0) is Side.PRIMARY  # heard without a gap since 3.0
    p.switch(Side.PRIMARY)
    assert p.switches == 2
    # Never to a backup that is quiet too.
    q = DualPolicy()
    q.on_heard(Side.PRIMARY, 0.0)
    q.on_heard(Side.BACKUP, 0.0)
    assert q.decide(10.0) is None


async def test_the_gateway_switches_to_the_backup_within_2s_and_commands_go_on(
        provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=5.0)) as fleet:
        await ready_to_fly(fleet)
        port = int(fleet.endpoints[0].rsplit(":", 1)[1])
        relay = FreezingRelay(port)
        await relay.start()
        try:
            base = gateway_config(nats_server.url, [f"tcp:127.0.0.1:{relay.port}"], tmp_path / "state",
                                  commands=COMMANDS)
            vehicle = dataclasses.replace(base.vehicles[0], backup=Endpoint.parse(fleet.endpoints[0]))
            gw = Gateway(dataclasses.replace(base, vehicles=(vehicle,)))
            svc = CommandService()
            gw.services.append(svc)
            twin = gw.twins[VID]
            async with running(gw), CommandClient(provisioned, ENV, issuer="pytest") as client:
                await wait_for(lambda: twin.dual is not None and twin.dual.connected(Side.PRIMARY)
                               and twin.dual.connected(Side.BACKUP) and twin.model.armed is not None, timeout_s=15)
                assert twin.dual is not None and twin.dual.active is Side.PRIMARY
                assert (await client.call(VID, "set_mode", {"mode": "GUIDED"}, timeout_s=20)).accepted
                messages = twin.session.health().messages_in
                # The primary goes silent (nothing closes): a command sent at that moment.
                relay.frozen = True
                silent = time.monotonic()
                cmd_id = await client.publish(VID, "set_mode", {"mode": "LOITER"})
                await wait_for(lambda: twin.dual is not None and twin.dual.active is Side.BACKUP, timeout_s=5)
                switched_s = time.monotonic() - silent
                print(f"switched to the backup {switched_s:.2f} s after the primary went silent")
                assert switched_s <= 2.0, switched_s
                result = await client.wait(cmd_id, 30, vid=VID)
                assert result.accepted, result
                assert fleet.vehicles[0].mode == "LOITER"
                # Telemetry kept flowing, and the link never counted as lost.
                await wait_for(lambda: twin.session.health().messages_in > messages + 20, timeout_s=5)
                assert twin.link.is_up
                assert (await client.call(VID, "set_mode", {"mode": "GUIDED"}, timeout_s=20)).accepted

                async def shows_backup() -> bool:
                    link = (await current_state(provisioned.jetstream(), ENV, VID)).get((VID, "link"))
                    return link is not None and link.data.get("active_link") == "backup"

                await wait_for_async(shows_backup, timeout_s=5)
                # The primary back and steady: the gateway returns to it.
                relay.frozen = False
                await wait_for(lambda: twin.dual is not None and twin.dual.active is Side.PRIMARY, timeout_s=12)
                assert (await client.call(VID, "set_mode", {"mode": "LOITER"}, timeout_s=20)).accepted
            events = await collect_events(provisioned)
            assert not [t for _, t, _, _ in events if t == EventType.LINK_LOST]
            results = [d for _, t, d, _ in events if t == EventType.CMD_RESULT and d.get("cmd_id") == cmd_id]
            assert len(results) == 1, results
        finally:
            await relay.close()
            await anyio.lowlevel.checkpoint()


def test_backup_config_is_checked() -> None:
    import pytest

    from mavjet.contract.errors import ConfigError
    from mavjet.gateway.config import parse_backup

    assert parse_backup("VID-001=tcp:10.0.0.5:5760") == ("VID-001", Endpoint.parse("tcp:10.0.0.5:5760"))
    with pytest.raises(ConfigError, match="VID=ENDPOINT"):
        parse_backup("tcp:10.0.0.5:5760")
    ep = Endpoint.parse("tcp:127.0.0.1:5760")
    with pytest.raises(ConfigError, match="primary endpoint itself"):
        VehicleConfig(vid=VID, endpoint=ep, backup=ep)
