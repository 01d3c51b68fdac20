"""Leases on a real 3-node R3 cluster: a node killed under them.

- A follower of KV_TWIN_LEASES killed: the stream keeps its quorum, renews
  go on, and the owner keeps acting without a gap.
- The stream's leader killed (the owner connected to it): no write commits
  until the two survivors elect a leader (raft's election timeout, 4 to 9 s,
  longer than the owner's `fence_after_s`), so the owner is fenced; then
  whichever compare-and-set lands first owns the vehicle, the fenced owner
  renewing its own lease (same term) or the standby taking it over (a new,
  larger token). Both are correct; the test accepts either, asserts the lease
  survived (the key was never lost), that there was never more than one
  owner, and prints which happened.
"""

from __future__ import annotations

import itertools
import time

import anyio
import pytest
from nats.aio.client import Client

from mavjet.contract.subjects import LEASES_STREAM, lease_key, lease_kv_subject
from mavjet.gateway.ownership.lease import ChangeKind, LeaseTiming
from tests.ownership.support import ENV, gateway, owner_then_standby, provision_leases
from tests.support.cluster import NatsCluster

pytestmark = pytest.mark.waits  # a cluster's start and its elections

T = LeaseTiming()
VID = "VID-001"
RECOVERY_S = 30.0  # election (<= 9 s), the client's reconnect, a renew period: with room on a busy 2-core machine


async def until(what: str, timeout_s: float, check: object) -> object:
    """Call the async `check` until it returns something truthy, ignoring errors (elections), within a deadline."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            out = await check()  # type: ignore[operator]
            if out:
                return out
        except Exception as exc:  # timeouts and 503s while the cluster elects
            last = exc
        await anyio.sleep(0.2)
    raise AssertionError(f"{what} not within {timeout_s}s: {last!r}")


async def setup(nc: Client) -> str:
    """Provision the lease bucket at R3 and return its stream leader's name."""

    async def provisioned() -> bool:
        await provision_leases(nc, replicas=3)
        return True

    await until("provision R3", 60.0, provisioned)

    async def leader() -> str | None:
        info = await nc.jetstream(timeout=2).stream_info(LEASES_STREAM)
        return info.cluster.leader if info.cluster is not None and len(info.cluster.replicas or []) == 2 else None

    return str(await until("lease stream leader and replicas", 60.0, leader))


async def lease_revision(nc: Client) -> int:
    msg = await nc.jetstream(timeout=2).get_msg(LEASES_STREAM, subject=lease_kv_subject(lease_key(ENV, VID)))
    assert not (msg.headers or {}).get("KV-Operation"), "the lease was deleted"
    return int(msg.seq or 0)


def servers(cluster: NatsCluster, first: str) -> list[str]:
    """Every node's URL, `first` first (the clients connect in order: dont_randomize)."""
    return [cluster.node_named(first).url] + [cluster.node_named(n).url for n in cluster.names if n != first]


RECONNECT = {"reconnect_time_wait": 0.2, "max_reconnect_attempts": -1, "dont_randomize": True}


async def test_a_follower_killed_the_owner_keeps_acting(nats_cluster: NatsCluster, cluster_nc: Client) -> None:
    leader = await setup(cluster_nc)
    victim = next(n for n in nats_cluster.names if n != leader)
    other = next(n for n in nats_cluster.names if n not in (leader, victim))
    async with (gateway(servers(nats_cluster, leader), "gw-a", [VID], **RECONNECT) as a,
                gateway(servers(nats_cluster, other), "gw-b", [VID], **RECONNECT) as b,
                anyio.create_task_group() as tg):
        watch = await owner_then_standby(tg, a, b, VID, owns_within_s=10.0)
        await anyio.sleep(2 * T.renew_every_s)
        before = await lease_revision(cluster_nc)
        nats_cluster.node_named(victim).stop(kill=True)
        killed = time.monotonic()
        await anyio.sleep(T.ttl_s + 2 * T.renew_every_s)
        assert a.keeper.may_act(VID) and not b.keeper.may_act(VID)
        acting = [t for t in watch.acting.get("gw-a", []) if t >= killed]
        gaps = [y - x for x, y in itertools.pairwise(acting)]
        print(f"follower {victim} killed: owner acted throughout, longest gap between samples "
              f"{max(gaps):.3f} s, renew latency {a.keeper.renew_latency_s}")
        assert acting and acting[0] - killed < 0.1 and max(gaps) < 0.5  # sampling every 10 ms, no fence
        assert ChangeKind.FENCED not in [c.kind for c in a.heard.changes]
        assert await lease_revision(cluster_nc) >= before + 5  # renews kept committing with two of three
        assert watch.both == []
        tg.cancel_scope.cancel()


async def test_the_leader_killed_the_owner_is_fenced_then_one_owns(nats_cluster: NatsCluster,
                                                                   cluster_nc: Client) -> None:
    leader = await setup(cluster_nc)
    other = next(n for n in nats_cluster.names if n != leader)
    async with (gateway(servers(nats_cluster, leader), "gw-a", [VID], **RECONNECT) as a,
                gateway(servers(nats_cluster, other), "gw-b", [VID], **RECONNECT) as b,
                anyio.create_task_group() as tg):
        watch = await owner_then_standby(tg, a, b, VID, owns_within_s=10.0)
        await anyio.sleep(2 * T.renew_every_s)
        before = await lease_revision(cluster_nc)
        token_a = a.keeper.token(VID)
        assert token_a is not None
        nats_cluster.node_named(leader).stop(kill=True)
        killed = time.monotonic()
        with anyio.fail_after(RECOVERY_S):
            while True:
                owners = [g for g in (a, b) if g.keeper.may_act(VID)]
                if owners and (owners[0] is b or any(c.kind is ChangeKind.RESUMED for c in a.heard.changes)):
                    break
                await anyio.sleep(0.02)
        recovered = time.monotonic() - killed
        await anyio.sleep(0.05)  # the watcher samples every 10 ms: let it see the owner
        owner = owners[0]
        fenced_a = [c.at_s for c in a.heard.changes if c.kind is ChangeKind.FENCED and c.at_s >= killed]
        how = "the fenced owner resumed (same term)" if owner is a else "the standby took over (new term)"
        print(f"leader {leader} killed: owner fenced after "
              f"{(fenced_a[0] - killed) if fenced_a else float('nan'):.2f} s; {how} after {recovered:.2f} s")
        assert watch.both == []
        last_a = watch.last_acting("gw-a") if owner is b else None
        if owner is b:
            token_b = b.keeper.token(VID)
            assert token_b is not None and token_b > token_a
            first_b = watch.first_acting_after("gw-b", killed)
            assert last_a is not None and first_b is not None and first_b > last_a
        else:
            assert a.keeper.token(VID) == token_a
        # The lease survived the node: the key is there, written since, by the owner.
        assert int(str(await until("lease readable", 20.0, lambda: lease_revision(cluster_nc)))) > before
        await anyio.sleep(2 * T.renew_every_s)
        assert owner.keeper.may_act(VID) and watch.both == []
        tg.cancel_scope.cancel()
