"""The shadow watches under `mavjet auth` credentials, on a real server running the generated configuration.

A per-vehicle credential keeps the per-key watch (filtered create) and cannot
use the multi-filter one; a hub gateway credential uses the multi-filter
watch; what the hub's wider create permission exposes is what
docs/security.md says (every TWIN_SHADOW key, read-only), and no more.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from mavjet.contract.subjects import SHADOW_BUCKET, SHADOW_STREAM, shadow_key, shadow_kv_subject
from mavjet.gateway.shadow.kvstore import DesiredEntry, KeyWatch, ShadowStore
from mavjet.gateway.shadow.watch import KeyDesired, SharedDesired
from mavjet.ops.provision import DEFINITIONS_DIR, load_definitions, provision
from tests.security.conftest import ENV, Secured, secured_server
from tests.security.support import JS_TIMEOUT_S, clean, refused
from tests.support import wait_for

pytestmark = pytest.mark.timeout(60)


class Access:
    """The `NatsAccess` part ShadowStore uses, over one identity's connection."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.js = nc.jetstream(timeout=JS_TIMEOUT_S)
        self.connected = anyio.Event()
        self.connected.set()


def store(nc: Client) -> ShadowStore:
    return ShadowStore(Access(nc))  # type: ignore[arg-type]


@pytest.fixture
async def hub(tmp_path: Path) -> AsyncIterator[Secured]:
    """tests/security's server (VID-001, VID-002 and `hub`=VID-003,VID-004), provisioned."""
    s = secured_server(tmp_path)
    try:
        admin = await s.connect("admin")
        try:
            await provision(admin.jetstream(), load_definitions(DEFINITIONS_DIR, env=ENV, replicas=1))
        finally:
            await admin.close()
        yield s
    finally:
        s.server.stop()


def desired(vid: str) -> str:
    return shadow_key(ENV, vid, "desired")


async def test_vehicle_credential_keeps_its_per_key_watch_and_nothing_more(hub: Secured) -> None:
    v1, op = await hub.connect("VID-001"), await hub.connect("operator")
    try:
        okv = await op.jetstream(timeout=JS_TIMEOUT_S).key_value(SHADOW_BUCKET)
        r1 = await okv.put(desired("VID-001"), b'{"mode":"GUIDED"}')
        await okv.put(desired("VID-002"), b'{"mode":"LOITER"}')

        # What a one-vehicle gateway runs (ShadowService with one vehicle): the per-key watch.
        got: list[DesiredEntry] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(KeyDesired(store(v1), resync_interval_s=0.5).follow, desired("VID-001"), got.append)
            await wait_for(lambda: DesiredEntry(r1, b'{"mode":"GUIDED"}') in got, 5)
            r2 = await okv.put(desired("VID-001"), b'{"mode":"AUTO"}')
            await wait_for(lambda: any(e.revision == r2 for e in got), 5)
            await anyio.sleep(1.2)  # two resync gets (direct get on its own key) pass without a violation
            tg.cancel_scope.cancel()
        clean(v1)

        # Not another vehicle's key, and not the multi-filter watch, even over its own key alone
        # (the multi-filter create goes through the unfiltered subject, closed to a vehicle).
        spy = KeyWatch(store(v1), desired("VID-002"))
        await refused(v1, f"$JS.API.CONSUMER.CREATE.{SHADOW_STREAM}.shadow_", spy.start)
        for keys in ([desired("VID-001"), desired("VID-002")], [desired("VID-001")]):
            watch = SharedDesired(store(v1), keys, resync_interval_s=0.5, retry_s=5.0)
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch.run)
                await refused(v1, f"$JS.API.CONSUMER.CREATE.{SHADOW_STREAM}.shadow_", anyio.lowlevel.checkpoint)
                tg.cancel_scope.cancel()
            assert watch.consumers_created == 0 and watch.last == {}
    finally:
        await v1.close()
        await op.close()


async def test_hub_credential_runs_the_multi_filter_watch(hub: Secured) -> None:
    gw, op, admin = await hub.connect("hub"), await hub.connect("operator"), await hub.connect("admin")
    try:
        okv = await op.jetstream(timeout=JS_TIMEOUT_S).key_value(SHADOW_BUCKET)
        r3 = await okv.put(desired("VID-003"), b'{"mode":"GUIDED"}')
        watch = SharedDesired(store(gw), [desired("VID-003"), desired("VID-004")], resync_interval_s=0.3,
                              grace_s=0.3)
        got: list[DesiredEntry] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch.run)
            with anyio.fail_after(5):
                await watch.ready.wait()
            assert watch.last[desired("VID-003")] == DesiredEntry(r3, b'{"mode":"GUIDED"}')
            assert watch.last[desired("VID-004")] == DesiredEntry(0, None)
            tg.start_soon(watch.follow, desired("VID-004"), got.append)
            r4 = await okv.put(desired("VID-004"), b'{"armed":false}')
            await wait_for(lambda: any(e.revision == r4 for e in got), 5)
            await wait_for(lambda: watch.checks >= 3, 5)  # its consumer-info checks are allowed
            assert watch.restarts == 0 and watch.consumers_created == 1
            info = await admin.jetstream().stream_info(SHADOW_STREAM)
            assert info.state.consumer_count == 1
            tg.cancel_scope.cancel()
        clean(gw)

        # The documented exposure: a hub may read any TWIN_SHADOW key through a named consumer
        # (here VID-001's reported), read-only. Still closed: the legacy unnamed create (nats-py's
        # watch), direct gets of other vehicles' keys, deleting consumers. (Writes are untouched by
        # the added permissions, which are JetStream API requests only: tests/security covers them.)
        akv = await admin.jetstream(timeout=JS_TIMEOUT_S).key_value(SHADOW_BUCKET)
        await akv.put(shadow_key(ENV, "VID-001", "reported"), b"{}")
        js = gw.jetstream(timeout=JS_TIMEOUT_S)
        inbox = gw.new_inbox()
        sub = await gw.subscribe(inbox)
        await js.add_consumer(SHADOW_STREAM, ConsumerConfig(
            name="hub_reads", filter_subjects=[shadow_kv_subject(shadow_key(ENV, "VID-001", "reported"))],
            deliver_subject=inbox, deliver_policy=DeliverPolicy.LAST_PER_SUBJECT, ack_policy=AckPolicy.NONE,
            inactive_threshold=2.0, mem_storage=True))
        assert (await sub.next_msg(timeout=2)).data == b"{}"
        await sub.unsubscribe()
        clean(gw)
        kv = await js.key_value(SHADOW_BUCKET)
        await refused(gw, f"$JS.API.CONSUMER.CREATE.{SHADOW_STREAM}", kv.watchall)
        await refused(gw, f"$JS.API.DIRECT.GET.{SHADOW_STREAM}.$KV.{SHADOW_BUCKET}.{desired('VID-001')}",
                      lambda: kv.get(desired("VID-001")))
        await refused(gw, f"$JS.API.CONSUMER.DELETE.{SHADOW_STREAM}.hub_reads",
                      lambda: js.delete_consumer(SHADOW_STREAM, "hub_reads"))
    finally:
        for nc in (gw, op, admin):
            await nc.close()
