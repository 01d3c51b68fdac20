"""One shadow watch per gateway (issue 50 item 2): one consumer for every vehicle's `desired`, on a real server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import nats.errors
import nats.js.errors
import pytest
from nats.aio.client import Client
from nats.js.kv import KeyValue

from mavjet.contract.subjects import SHADOW_BUCKET, SHADOW_STREAM, shadow_key
from mavjet.gateway.shadow.kvstore import DesiredEntry, ShadowStore
from mavjet.gateway.shadow.watch import SharedDesired
from mavjet.ops.natsserver import NatsServer
from mavjet.sim.fleet import SimConfig, SimFleet
from tests.shadow.harness import shadowed
from tests.support import ENV, wait_for

pytestmark = pytest.mark.timeout(60)


class Access:
    """The `NatsAccess` part ShadowStore uses, over a test's own real connection."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.js = nc.jetstream(timeout=2.0)
        self.connected = anyio.Event()
        self.connected.set()


async def consumers(nc: Client) -> int:
    return int((await nc.jetstream().stream_info(SHADOW_STREAM)).state.consumer_count)


async def test_twenty_vehicles_one_consumer_and_a_change_reaches_only_its_vehicle(
    provisioned: Client, nats_server: NatsServer, tmp_path: Path
) -> None:
    n = 20
    async with SimFleet(SimConfig(vehicles=n, base_port=0, speedup=4.0)) as fleet, \
            shadowed(provisioned, nats_server.url, fleet, tmp_path / "state") as sh:
        watch = sh.shadow.watch
        assert watch is not None and len(watch.keys) == n
        with anyio.fail_after(10):
            await watch.ready.wait()
        # Every reconciler runs (this gateway owns all 20) and is fed by the one watch.
        await wait_for(lambda: all(rec.passes > 0 for rec in sh.shadow.reconcilers.values()), 20)
        assert await consumers(provisioned) == 1 and watch.consumers_created == 1

        target = "VID-007"
        rev = await sh.set_desired(target, {"params": {"RTL_ALT": 2450}})
        await sh.wait_converged(target, rev)
        assert fleet.vehicles[6].params["RTL_ALT"] == 2450.0
        for vid, rec in sh.shadow.reconcilers.items():
            assert rec.desired.revision == (rev if vid == target else 0), vid
        assert await consumers(provisioned) == 1 and watch.restarts == 0


@pytest.fixture
async def kv(provisioned: Client) -> KeyValue:
    return await provisioned.jetstream().key_value(SHADOW_BUCKET)


@pytest.fixture
async def shared(provisioned: Client) -> AsyncIterator[SharedDesired]:
    keys = [shadow_key(ENV, f"VID-{i:03d}", "desired") for i in (1, 2, 3)]
    watch = SharedDesired(ShadowStore(Access(provisioned)), keys, resync_interval_s=0.5, retry_s=0.1,  # type: ignore[arg-type]
                          grace_s=0.3)
    # A plain task, not a task group: pytest-asyncio may set a fixture up and tear it down in
    # different tasks, which a cancel scope does not allow (as in tests/shadow/harness.py).
    task = asyncio.create_task(watch.run())
    try:
        yield watch
    finally:
        task.cancel()
        with anyio.move_on_after(5):
            await asyncio.gather(task, return_exceptions=True)


async def test_snapshot_deletes_absent_keys_and_hand_over_of_the_last_value(
    provisioned: Client, kv: KeyValue
) -> None:
    k1, k2, k3 = (shadow_key(ENV, f"VID-{i:03d}", "desired") for i in (1, 2, 3))
    r1 = await kv.put(k1, b'{"mode":"GUIDED"}')
    await kv.put(k2, b"{}")
    await kv.delete(k2)
    keys = [k1, k2, k3]
    watch = SharedDesired(ShadowStore(Access(provisioned)), keys, resync_interval_s=5.0)  # type: ignore[arg-type]
    got: list[DesiredEntry] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch.run)
        with anyio.fail_after(5):
            await watch.ready.wait()
        # the current value of each key: a value, a delete marker (None), never written (absent)
        assert watch.last[k1] == DesiredEntry(r1, b'{"mode":"GUIDED"}')
        assert watch.last[k2].value is None and watch.last[k2].revision > r1
        assert watch.last[k3] == DesiredEntry(0, None)

        # A listener that (re)starts, as a reconciler does on becoming the owner, is handed the last value at once.
        tg.start_soon(watch.follow, k1, got.append)
        await wait_for(lambda: got == [DesiredEntry(r1, b'{"mode":"GUIDED"}')], 2)
        r2 = await kv.put(k1, b'{"mode":"AUTO"}')
        await wait_for(lambda: len(got) == 2 and got[1].revision == r2, 2)
        r3 = await kv.put(k3, b'{"mode":"LOITER"}')  # another key: not this listener's
        await wait_for(lambda: watch.last[k3].revision == r3, 2)
        assert len(got) == 2
        tg.cancel_scope.cancel()
    assert watch.consumers_created == 1


async def test_consumer_lost_is_found_by_the_periodic_check(
    provisioned: Client, kv: KeyValue, shared: SharedDesired
) -> None:
    with anyio.fail_after(5):
        await shared.ready.wait()
    await wait_for(lambda: shared.checks >= 2, 3)  # a healthy consumer passes its checks
    assert shared.restarts == 0
    # The consumer disappears behind the gateway's back; an update written meanwhile is not lost.
    [name] = shared.consumer_names
    await provisioned.jetstream().delete_consumer(SHADOW_STREAM, name)
    k2 = shadow_key(ENV, "VID-002", "desired")
    rev = await kv.put(k2, b'{"armed":false}')
    await wait_for(lambda: k2 in shared.last and shared.last[k2].revision == rev, 3)
    assert shared.restarts == 1 and shared.consumers_created == 2


async def test_server_restart_recreates_the_watch(
    provisioned: Client, nats_server: NatsServer, kv: KeyValue, shared: SharedDesired
) -> None:
    with anyio.fail_after(5):
        await shared.ready.wait()
    nats_server.restart()
    await wait_for(lambda: provisioned.is_connected, 15)
    k1 = shadow_key(ENV, "VID-001", "desired")
    with anyio.fail_after(10):
        while True:  # JetStream may need a moment after the restart (bounded by fail_after)
            try:
                rev = await kv.put(k1, b'{"mode":"RTL"}')
                break
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError, nats.js.errors.ServiceUnavailableError):
                await anyio.sleep(0.2)
    await wait_for(lambda: k1 in shared.last and shared.last[k1].revision == rev, 10)
    assert shared.consumers_created >= 2
    assert await consumers(provisioned) <= 2  # the new one (the old one, if it survived, expires unused)


async def test_keys_beyond_max_filters_are_split_over_consumers(provisioned: Client, kv: KeyValue) -> None:
    # The server's create time grows with the square of the filters (watch.MAX_FILTERS): 5 keys at 2 a consumer.
    keys = [shadow_key(ENV, f"VID-{i:03d}", "desired") for i in range(1, 6)]
    revs = {k: await kv.put(k, b"{}") for k in keys}
    watch = SharedDesired(ShadowStore(Access(provisioned)), keys, resync_interval_s=5.0,  # type: ignore[arg-type]
                          max_filters=2)
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch.run)
        with anyio.fail_after(5):
            await watch.ready.wait()
        assert {k: e.revision for k, e in watch.last.items()} == revs
        assert len(watch.groups) == 3 and await consumers(provisioned) == 3
        r5 = await kv.put(keys[4], b'{"mode":"RTL"}')
        await wait_for(lambda: watch.last[keys[4]].revision == r5, 2)
        tg.cancel_scope.cancel()
