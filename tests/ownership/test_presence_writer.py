"""The presence writer on a real nats-server: standbys only, spread over the period, backing off when refused."""

from __future__ import annotations

import time

import anyio
from nats.aio.client import Client

from mavjet.contract.subjects import LEASES_STREAM, lease_kv_subject, presence_filter
from mavjet.gateway.ownership.keeper import GatewayIdentity
from mavjet.gateway.ownership.presence import SLOTS, LinkView, PresenceWriter
from mavjet.gateway.ownership.store import JetStreamLeaseStore
from tests.ownership.support import ENV, provision_leases

VIDS = [f"VID-{i:03d}" for i in range(1, 41)]


async def test_only_standbys_write_spread_over_the_period_and_a_new_owner_deletes(nc: Client) -> None:
    await provision_leases(nc)
    owned = {"VID-001", "VID-002"}  # this gateway owns these: no record
    stored: list[tuple[float, str]] = []

    async def on_msg(msg: object) -> None:
        stored.append((time.monotonic(), msg.subject))  # type: ignore[attr-defined]

    sub = await nc.subscribe(presence_filter(ENV), cb=on_msg)
    writer = PresenceWriter(JetStreamLeaseStore(nc.jetstream), env=ENV, identity=GatewayIdentity.of_this_process("gw-b"),
                            vids=VIDS, standby_for=lambda v: None if v in owned else "gw-a@h:1:aa",
                            link=lambda v: LinkView("up"), every_s=1.0)
    async with anyio.create_task_group() as tg:
        start = time.monotonic()
        await tg.start(writer.run)
        await anyio.sleep(1.05)  # one period: every standby vehicle once, turn by turn
        assert writer.standing == len(VIDS) - len(owned)
        turns = {round((t - start) / (1.0 / SLOTS)) for t, _ in stored}
        assert len(turns) >= SLOTS - 2, turns  # spread over the turns, not one burst
        assert not any(f".{v}." in subject for _, subject in stored for v in owned)
        owned.add("VID-003")  # it takes VID-003 over: its record goes at once, not at its next turn
        writer.kick("VID-003")
        with anyio.fail_after(1.0):
            while writer.standing != len(VIDS) - len(owned):
                await anyio.sleep(0.01)
        await writer.remove_all(timeout_s=2.0)  # a clean stop
        assert writer.standing == 0
        tg.cancel_scope.cancel()
    await sub.unsubscribe()
    msg = await nc.jetstream().get_msg(LEASES_STREAM, subject=lease_kv_subject(writer.key("VID-010")))
    assert (msg.headers or {}).get("KV-Operation") == "DEL"


async def test_refused_writes_back_off_instead_of_one_a_period_per_vehicle(nc: Client) -> None:
    # No such bucket: every write fails at once, as a credential from before presence is refused.
    store = JetStreamLeaseStore(nc.jetstream, bucket="NO_SUCH_BUCKET", timeout_s=0.2)
    writer = PresenceWriter(store, env=ENV, identity=GatewayIdentity.of_this_process("gw-b"), vids=VIDS,
                            standby_for=lambda v: "gw-a@h:1:aa", link=lambda v: LinkView("up"), every_s=0.2)
    async with anyio.create_task_group() as tg:
        await tg.start(writer.run)
        await anyio.sleep(2.0)  # ten periods: 400 writes without the back-off
        tg.cancel_scope.cancel()
    # A failed turn pauses the periodic writes 0.2, 0.4, 0.8 s ...: a few turns of four vehicles each.
    assert writer.writes == 0 and 0 < writer.failures <= 60, writer.failures

