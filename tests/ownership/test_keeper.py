"""Lease keepers against a real nats-server: one owner, takeover after a crash, release, a partition.

Every keeper has its own NATS connection and its own identity (two keepers
of one test process differ by their nonce, as two gateways on one host do).
Times measured here are printed (`pytest -s`) and bounded by assertions.
"""

from __future__ import annotations

import json
import time

import anyio
import pytest
from nats.aio.client import Client

from mavjet.contract.subjects import LEASES_BUCKET, lease_key
from mavjet.gateway.ownership.lease import ChangeKind, Intent, LeaseState, LeaseTiming
from mavjet.gateway.ownership.store import (
    JetStreamLeaseStore,
    LeaseEntry,
    LeaseStore,
    LeaseUnavailable,
)
from mavjet.ops.natsserver import NatsServer
from tests.ownership.support import (
    ENV,
    FreezingRelay,
    Gateway,
    Overlap,
    gateway,
    owner_then_standby,
    provision_leases,
    start,
)

T = LeaseTiming()
VID = "VID-001"


async def owner_of(gws: list[Gateway], vid: str, *, timeout_s: float) -> Gateway:
    """The one gateway that may act for `vid`, waiting up to `timeout_s` for there to be one."""
    with anyio.fail_after(timeout_s):
        while True:
            owners = [g for g in gws if g.keeper.may_act(vid)]
            assert len(owners) <= 1, [g.name for g in owners]
            if owners:
                return owners[0]
            await anyio.sleep(0.01)


@pytest.fixture
async def leases(nc: Client) -> Client:
    await provision_leases(nc)
    return nc


async def test_two_keepers_one_owner_per_vehicle(nats_server: NatsServer, leases: Client) -> None:
    vids = ["VID-001", "VID-002", "VID-003"]
    async with (gateway(nats_server.url, "gw-a", vids) as a, gateway(nats_server.url, "gw-a", vids) as b,
                anyio.create_task_group() as tg):
        assert a.keeper.identity.holder != b.keeper.identity.holder  # same name, same host, same pid
        watch = Overlap([a, b], VID)
        await tg.start(watch.run)
        await start(tg, a)
        await start(tg, b)
        for vid in vids:
            await owner_of([a, b], vid, timeout_s=3.0)
        await anyio.sleep(3 * T.renew_every_s)  # renews go on; nobody takes anything over
        for vid in vids:
            owners = [g for g in (a, b) if g.keeper.may_act(vid)]
            assert len(owners) == 1, vid
            standby = b if owners[0] is a else a
            assert standby.keeper.state(vid) is LeaseState.STANDBY
            assert standby.keeper.holder(vid) == owners[0].keeper.identity.holder
            assert owners[0].keeper.token(vid) and standby.keeper.token(vid) is None
        assert watch.both == []
        assert a.keeper.takeovers == b.keeper.takeovers == 0
        # The value is what an operator reads with `nats kv get`: who, where, since when.
        entry = await leases.jetstream().get_msg(f"KV_{LEASES_BUCKET}", subject=f"$KV.{LEASES_BUCKET}.{lease_key(ENV, VID)}")
        doc = json.loads(entry.data)
        owner = a if a.keeper.may_act(VID) else b
        assert doc["holder"] == owner.keeper.identity.holder and doc["term"] == owner.keeper.token(VID)
        assert doc["since"].endswith("+00:00") and doc["pid"] > 0
        tg.cancel_scope.cancel()


async def test_the_owner_crashing_is_taken_over_within_ttl_plus_2s(nats_server: NatsServer, leases: Client) -> None:
    async with (gateway(nats_server.url, "gw-a", [VID]) as a, gateway(nats_server.url, "gw-b", [VID]) as b,
                anyio.create_task_group() as tg):
        watch = await owner_then_standby(tg, a, b, VID, owns_within_s=3.0)
        await anyio.sleep(1.5 * T.renew_every_s)
        assert b.keeper.state(VID) is LeaseState.STANDBY
        token_before = a.keeper.token(VID)
        assert token_before is not None
        assert a.scope is not None
        a.scope.cancel()  # SIGKILL as far as the lease goes: no release, no more renews
        killed = time.monotonic()
        await owner_of([b], VID, timeout_s=T.ttl_s + 2.0)
        took = time.monotonic() - killed
        print(f"takeover after a crash: {took:.2f} s (ttl {T.ttl_s} s)")
        assert took <= T.ttl_s + 2.0
        assert took >= T.ttl_s - T.renew_every_s - 0.25  # not before the TTL of the last renew it saw
        token = b.keeper.token(VID)
        assert token is not None and token > token_before
        [over] = [c for c in b.heard.changes if c.kind is ChangeKind.TAKEN_OVER]
        assert over.previous == a.keeper.identity.holder and over.holder == b.keeper.identity.holder
        assert over.token == token
        assert watch.both == []
        tg.cancel_scope.cancel()


async def test_a_clean_release_hands_over_within_one_renew_period(nats_server: NatsServer, leases: Client) -> None:
    async with (gateway(nats_server.url, "gw-a", [VID]) as a, gateway(nats_server.url, "gw-b", [VID]) as b,
                anyio.create_task_group() as tg):
        await start(tg, a)
        await owner_of([a], VID, timeout_s=3.0)
        await start(tg, b)
        await anyio.sleep(1.5 * T.renew_every_s)
        watch = Overlap([a, b], VID)
        await tg.start(watch.run)
        t0 = time.monotonic()
        await a.keeper.release(timeout_s=2.0)
        assert not a.keeper.may_act(VID) and a.keeper.state(VID) is LeaseState.STOPPED
        await owner_of([b], VID, timeout_s=2 * T.renew_every_s)
        took = time.monotonic() - t0
        print(f"handover after a release: {took:.2f} s (renew period {T.renew_every_s} s)")
        assert took <= T.renew_every_s + 0.5  # the standby's next read, then one create
        assert [c.kind for c in a.heard.changes][-1] is ChangeKind.RELEASED
        acquired = [c for c in b.heard.changes if c.kind is ChangeKind.ACQUIRED]
        assert len(acquired) == 1 and acquired[0].previous is None
        assert watch.both == []
        # The released keeper stays out: it neither renews nor takes the vehicle back.
        await anyio.sleep(2 * T.renew_every_s)
        assert not a.keeper.may_act(VID) and b.keeper.may_act(VID)
        tg.cancel_scope.cancel()


class HeldStore:
    """The real store, whose writes can be held back: a renew in flight at a chosen moment."""

    def __init__(self, real: LeaseStore) -> None:
        self.real = real
        self.hold = False
        self.held = anyio.Event()

    async def get(self, key: str) -> LeaseEntry:
        return await self.real.get(key)

    async def write(self, key: str, value: bytes, *, last: int) -> int:
        if self.hold:
            self.held.set()
            await anyio.sleep_forever()
        return await self.real.write(key, value, last=last)

    async def delete(self, key: str, *, last: int) -> int:
        return await self.real.delete(key, last=last)


async def test_release_after_the_keeper_was_cancelled_mid_renew(nats_server: NatsServer, leases: Client) -> None:
    async with gateway(nats_server.url, "gw-a", [VID]) as a, anyio.create_task_group() as tg:
        store = HeldStore(a.keeper.store)
        a.keeper.store = store
        await start(tg, a)
        await owner_of([a], VID, timeout_s=3.0)
        store.hold = True
        with anyio.fail_after(2 * T.renew_every_s):
            await store.held.wait()
        pending = a.keeper.machine(VID).pending
        assert pending is not None and pending.intent is Intent.RENEW
        assert a.scope is not None
        a.scope.cancel()  # the daemon's task group going down while a renew waits for its answer
        await anyio.sleep(0.05)
        assert a.keeper.machine(VID).pending is None  # told the renew's outcome is unknown
        store.hold = False
        await a.keeper.release(timeout_s=2.0)  # no loop runs any more: release performs the delete itself
        assert a.keeper.state(VID) is LeaseState.STOPPED and not a.keeper.may_act(VID)
        msg = await a.nc.jetstream().get_msg(f"KV_{LEASES_BUCKET}",
                                             subject=f"$KV.{LEASES_BUCKET}.{lease_key(ENV, VID)}")
        assert msg.headers is not None and msg.headers.get("KV-Operation") == "DEL"


async def test_an_owner_cut_off_from_nats_stops_acting_before_the_ttl(nats_server: NatsServer, leases: Client) -> None:
    relay = FreezingRelay(nats_server.port)
    await relay.start()
    try:
        async with (gateway(relay.url, "gw-a", [VID], allow_reconnect=False) as a,
                    gateway(nats_server.url, "gw-b", [VID]) as b, anyio.create_task_group() as tg):
            watch = await owner_then_standby(tg, a, b, VID, owns_within_s=3.0)
            await anyio.sleep(1.5 * T.renew_every_s)
            assert a.keeper.may_act(VID)
            relay.frozen = True  # a partition: nothing arrives, nothing fails
            cut = time.monotonic()
            with anyio.fail_after(T.ttl_s):
                await a.keeper.wait_until(VID, owner=False)
            fenced = time.monotonic() - cut
            assert a.nc.is_connected  # the client has not noticed anything: the fence did not wait for it
            await owner_of([b], VID, timeout_s=T.ttl_s + 2.0)
            taken = time.monotonic() - cut
            await anyio.sleep(0.05)  # the watcher samples every 10 ms: let it see the new owner
            last_a = watch.last_acting("gw-a")
            first_b = watch.first_acting_after("gw-b", cut)
            assert last_a is not None and first_b is not None
            print(f"partitioned owner fenced after {fenced:.2f} s; standby took over after {taken:.2f} s; "
                  f"gap between them {first_b - last_a:.2f} s")
            assert fenced <= T.fence_after_s + 0.5  # woken at the deadline (give or take a busy machine)
            # Exact, whatever the wake-up: every sample is may_act() at that instant, and the last good
            # renew was sent before the cut.
            assert last_a - cut < T.fence_after_s
            # The standby's clock started when it read the last renew, after that renew was sent.
            assert first_b - last_a >= T.ttl_s - T.fence_after_s - 0.05
            assert watch.both == []
            assert a.keeper.state(VID) is LeaseState.FENCED
            assert ChangeKind.FENCED in [c.kind for c in a.heard.changes]
            tg.cancel_scope.cancel()
    finally:
        await relay.close()


async def test_without_the_bucket_nobody_acts_and_the_error_says_why(nats_server: NatsServer, nc: Client) -> None:
    store = JetStreamLeaseStore(nc.jetstream)
    with pytest.raises(LeaseUnavailable, match="mavjet provision"):
        await store.get(lease_key(ENV, VID))
    async with gateway(nats_server.url, "gw-a", [VID]) as a, anyio.create_task_group() as tg:
        await start(tg, a)
        await anyio.sleep(2.5 * T.renew_every_s)
        assert not a.keeper.may_act(VID) and a.keeper.state(VID) is LeaseState.STANDBY
        assert a.heard.changes == []
        assert 2 <= a.keeper.ops <= 4  # one read a period, no busy retry
        tg.cancel_scope.cancel()
