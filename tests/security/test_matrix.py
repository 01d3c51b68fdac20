"""The permission matrix (docs/security.md), row by row, both ways, on a real nats-server.

Every row: what the identity may do works; what it may not is refused by the
server with a permissions violation. The hostile cases are the ones found in
issue 13: a VID-002 credential forging VID-001's `armed` event, reading and
terminating VID-001's commands, overwriting VID-001's `reported`, watching
every shadow.
"""

from __future__ import annotations

import json

import anyio
import pytest
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from mavjet.contract import envelope
from mavjet.contract.events import EventType
from mavjet.contract.natsconn import creds_inbox_prefix
from mavjet.contract.subjects import (
    BLOBS_BUCKET,
    CMD_STREAM,
    EVENTS_STREAM,
    LEASES_BUCKET,
    ROLLOUTS_BUCKET,
    SHADOW_BUCKET,
    STATE_STREAM,
    cmd_subject,
    event_subject,
    inflight_key,
    lease_key,
    lease_kv_subject,
    rollout_event_subject,
    rollout_key,
    shadow_key,
    state_subject,
)
from mavjet.gateway.commands.consumer import consumer_config, durable_name
from mavjet.gateway.config import CommandsConfig
from mavjet.gateway.ownership.store import JetStreamLeaseStore
from mavjet.gateway.shadow.kvstore import KeyWatch, ShadowStore
from tests.security.conftest import ENV, Secured
from tests.security.support import JS_TIMEOUT_S, clean, refused

pytestmark = pytest.mark.timeout(90)

KV_STREAM = f"KV_{SHADOW_BUCKET}"


def _event(vid: str, kind: str) -> bytes:
    return envelope.pack(vid, 1_000_000_000, {"armed": True}) if kind == "armed" else envelope.pack(vid, 1_000_000_000, {})


async def _stored(admin: Client, stream: str, subject: str) -> int:
    info = await admin.jetstream().stream_info(stream, subjects_filter=subject)
    return sum((info.state.subjects or {}).values())


class _Access:
    """The connection of one identity; the `.publisher`-shaped view KeyWatch and ShadowStore use."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.js = nc.jetstream(timeout=JS_TIMEOUT_S)


def _store(nc: Client) -> ShadowStore:
    """The gateway's ShadowStore over one identity's connection."""
    return ShadowStore(_Access(nc))  # type: ignore[arg-type]


async def test_inbox_prefix_comes_from_the_credential(secured: Secured) -> None:
    assert creds_inbox_prefix(secured.creds("VID-001")) == "_INBOX_VID-001"
    assert creds_inbox_prefix(secured.creds("hub")) == "_INBOX_hub"
    assert creds_inbox_prefix(str(secured.dir / "auth.conf")) is None


async def test_vehicle_publishes_its_own_state_and_events_only(hub: Secured) -> None:
    v1, v2, admin = await hub.connect("VID-001"), await hub.connect("VID-002"), await hub.connect("admin")
    try:
        js1 = v1.jetstream(timeout=JS_TIMEOUT_S)
        ack = await js1.publish(state_subject(ENV, "VID-001", "position"), envelope.pack("VID-001", 1_000_000_000, {}))
        assert ack.stream == STATE_STREAM
        ack = await js1.publish(event_subject(ENV, "VID-001", "armed"), _event("VID-001", "armed"))
        assert ack.stream == EVENTS_STREAM
        clean(v1)

        # Hostile: VID-002 forges VID-001's armed event and state.
        js2 = v2.jetstream(timeout=JS_TIMEOUT_S)
        forged = event_subject(ENV, "VID-001", "armed")
        await refused(v2, forged, lambda: js2.publish(forged, _event("VID-001", "armed")))
        await refused(v2, forged, lambda: v2.publish(forged, _event("VID-001", "armed")))
        st = state_subject(ENV, "VID-001", "position")
        await refused(v2, st, lambda: v2.publish(st, b"x"))
        assert await _stored(admin, EVENTS_STREAM, forged) == 1  # only VID-001's own

        # Not its own commands either (that is the operator's row).
        cmd = cmd_subject(ENV, "VID-002", "arm")
        await refused(v2, cmd, lambda: v2.publish(cmd, b"{}"))
    finally:
        for nc in (v1, v2, admin):
            await nc.close()


async def test_vehicle_pulls_and_acks_only_its_own_commands(hub: Secured) -> None:
    cfg = CommandsConfig(fetch_timeout_s=1.0)
    v1, v2, op = await hub.connect("VID-001"), await hub.connect("VID-002"), await hub.connect("operator")
    try:
        ojs = op.jetstream(timeout=JS_TIMEOUT_S)
        await ojs.publish(cmd_subject(ENV, "VID-001", "arm"), b'{"cmd_id":"c1"}')

        # Its own consumer: created with its own filter, pulled, acked.
        js1 = v1.jetstream(timeout=JS_TIMEOUT_S)
        await js1.add_consumer(CMD_STREAM, config=consumer_config(ENV, "VID-001", cfg))  # as the gateway makes it
        sub = await js1.pull_subscribe_bind(durable=durable_name("VID-001"), stream=CMD_STREAM)
        msgs = await sub.fetch(1, timeout=2)
        assert msgs[0].subject == cmd_subject(ENV, "VID-001", "arm")
        await msgs[0].ack_sync(timeout=JS_TIMEOUT_S)
        clean(v1)

        await ojs.publish(cmd_subject(ENV, "VID-001", "disarm"), b'{"cmd_id":"c2"}')
        js2 = v2.jetstream(timeout=JS_TIMEOUT_S)
        c1 = durable_name("VID-001")
        # Hostile: VID-002 binds to VID-001's consumer, pulls from it, terminates its command.
        await refused(v2, f"$JS.API.CONSUMER.INFO.{CMD_STREAM}.{c1}", lambda: js2.consumer_info(CMD_STREAM, c1))
        nxt = f"$JS.API.CONSUMER.MSG.NEXT.{CMD_STREAM}.{c1}"
        await refused(v2, nxt, lambda: v2.request(nxt, b'{"batch":1}', timeout=JS_TIMEOUT_S))
        ack = f"$JS.ACK.{CMD_STREAM}.{c1}.1.2.2.0.0"
        await refused(v2, ack, lambda: v2.publish(ack, b"+TERM"))
        # ... creates a consumer named like VID-001's, or filtered on VID-001's or every vehicle's commands.
        await refused(v2, f"$JS.API.CONSUMER.CREATE.{CMD_STREAM}.{c1}",
                      lambda: js2.add_consumer(CMD_STREAM, config=consumer_config(ENV, "VID-001", cfg)))
        wide = ConsumerConfig(name=durable_name("VID-002"), durable_name=durable_name("VID-002"),
                              filter_subject=f"fleet.{ENV}.veh.*.cmd.>", ack_policy=AckPolicy.EXPLICIT)
        await refused(v2, f"$JS.API.CONSUMER.CREATE.{CMD_STREAM}.gw_VID-002.fleet.{ENV}.veh.*",
                      lambda: js2.add_consumer(CMD_STREAM, config=wide))
        await refused(v2, f"$JS.API.CONSUMER.DURABLE.CREATE.{CMD_STREAM}",
                      lambda: v2.request(f"$JS.API.CONSUMER.DURABLE.CREATE.{CMD_STREAM}.x", b"{}", timeout=JS_TIMEOUT_S))
        await refused(v2, f"$JS.API.CONSUMER.CREATE.{CMD_STREAM}",
                      lambda: js2.add_consumer(CMD_STREAM, config=ConsumerConfig(filter_subject=f"fleet.{ENV}.veh.VID-001.cmd.>")))
        # The command is still there for VID-001.
        msgs = await sub.fetch(1, timeout=2)
        assert msgs[0].subject == cmd_subject(ENV, "VID-001", "disarm")
        await msgs[0].ack_sync(timeout=JS_TIMEOUT_S)

        # No stream or consumer administration.
        for subj in (f"$JS.API.STREAM.DELETE.{EVENTS_STREAM}", f"$JS.API.STREAM.PURGE.{CMD_STREAM}",
                     f"$JS.API.CONSUMER.DELETE.{CMD_STREAM}.{c1}"):
            await refused(v1, subj, lambda s=subj: v1.request(s, b"", timeout=JS_TIMEOUT_S))  # type: ignore[misc]
    finally:
        for nc in (v1, v2, op):
            await nc.close()


async def test_vehicle_shadow_own_keys_only(hub: Secured) -> None:
    v1, v2, op = await hub.connect("VID-001"), await hub.connect("VID-002"), await hub.connect("operator")
    try:
        okv = await op.jetstream(timeout=JS_TIMEOUT_S).key_value(SHADOW_BUCKET)
        await okv.put(shadow_key(ENV, "VID-001", "desired"), b'{"mode":"GUIDED"}')
        await okv.put(shadow_key(ENV, "VID-002", "desired"), b'{"mode":"LOITER"}')

        kv1 = await v1.jetstream(timeout=JS_TIMEOUT_S).key_value(SHADOW_BUCKET)
        assert (await kv1.get(shadow_key(ENV, "VID-001", "desired"))).value == b'{"mode":"GUIDED"}'
        rev = await kv1.put(shadow_key(ENV, "VID-001", "reported"), b'{"mode":"GUIDED"}')
        await kv1.put(shadow_key(ENV, "VID-001", "meta"), b"{}")
        await kv1.put(shadow_key(ENV, "VID-001", "config"), b"{}")
        # The filtered watch (what the gateway uses) works with these permissions.
        watch = await KeyWatch(_store(v1), shadow_key(ENV, "VID-001", "desired")).start()
        try:
            first = await watch.updates(2.0)
            assert first.value == b'{"mode":"GUIDED"}'
            await okv.put(shadow_key(ENV, "VID-001", "desired"), b'{"mode":"AUTO"}')
            assert (await watch.updates(2.0)).value == b'{"mode":"AUTO"}'
        finally:
            await watch.stop()
        clean(v1)

        # A vehicle does not write its own desired.
        d1 = f"$KV.{SHADOW_BUCKET}.{shadow_key(ENV, 'VID-001', 'desired')}"
        await refused(v1, d1, lambda: kv1.put(shadow_key(ENV, "VID-001", "desired"), b"{}"))

        # Hostile: VID-002 overwrites VID-001's reported, reads its desired, watches every shadow.
        kv2 = await v2.jetstream(timeout=JS_TIMEOUT_S).key_value(SHADOW_BUCKET)
        r1 = shadow_key(ENV, "VID-001", "reported")
        await refused(v2, f"$KV.{SHADOW_BUCKET}.{r1}", lambda: kv2.put(r1, b'{"mode":"forged"}'))
        assert (await okv.get(r1)).revision == rev
        await refused(v2, f"$JS.API.DIRECT.GET.{KV_STREAM}.$KV.{SHADOW_BUCKET}.{shadow_key(ENV, 'VID-001', 'desired')}",
                      lambda: kv2.get(shadow_key(ENV, "VID-001", "desired")))
        await refused(v2, f"$JS.API.CONSUMER.CREATE.{KV_STREAM}", lambda: kv2.watch(f"fleet.{ENV}.veh.*.desired"))
        await refused(v2, f"$JS.API.CONSUMER.CREATE.{KV_STREAM}", kv2.watchall)
        spy = KeyWatch(_store(v2), f"fleet.{ENV}.veh.*.desired")
        await refused(v2, f"$JS.API.CONSUMER.CREATE.{KV_STREAM}.shadow_", spy.start)
        await refused(v2, "_INBOX.>", lambda: v2.subscribe("_INBOX.>"))
        await refused(v2, "_INBOX_VID-001.>", lambda: v2.subscribe("_INBOX_VID-001.>"))
        await refused(v2, f"fleet.{ENV}.veh.VID-001.state.>", lambda: v2.subscribe(f"fleet.{ENV}.veh.VID-001.state.>"))
    finally:
        for nc in (v1, v2, op):
            await nc.close()


async def test_hub_gateway_serves_its_vehicles_only(hub: Secured) -> None:
    gw = await hub.connect("hub")
    try:
        js = gw.jetstream(timeout=JS_TIMEOUT_S)
        for vid in ("VID-003", "VID-004"):
            await js.publish(event_subject(ENV, vid, "armed"), _event(vid, "armed"))
            await js.add_consumer(CMD_STREAM, config=consumer_config(ENV, vid, CommandsConfig()))
        clean(gw)
        forged = event_subject(ENV, "VID-001", "armed")
        await refused(gw, forged, lambda: gw.publish(forged, b""))
    finally:
        await gw.close()


async def test_missions_are_readable_blobs_not_writable(hub: Secured) -> None:
    v1, op = await hub.connect("VID-001"), await hub.connect("operator")
    try:
        obs = await op.jetstream(timeout=JS_TIMEOUT_S).object_store(BLOBS_BUCKET)
        await obs.put("missions/survey.plan", b'{"mission": {}}')
        vobs = await v1.jetstream(timeout=JS_TIMEOUT_S).object_store(BLOBS_BUCKET)
        assert (await vobs.get("missions/survey.plan")).data == b'{"mission": {}}'
        clean(v1)
        await refused(v1, f"$O.{BLOBS_BUCKET}.", lambda: vobs.put("missions/evil.plan", b"{}"))
    finally:
        await v1.close()
        await op.close()


async def test_operator_commands_and_desired_but_no_destruction(hub: Secured) -> None:
    op = await hub.connect("operator")
    try:
        js = op.jetstream(timeout=JS_TIMEOUT_S)
        ack = await js.publish(cmd_subject(ENV, "VID-002", "arm"), b"{}")
        assert ack.stream == CMD_STREAM
        kv = await js.key_value(SHADOW_BUCKET)
        await kv.put(shadow_key(ENV, "VID-002", "desired"), json.dumps({"mode": "GUIDED"}).encode())
        # It reads everything: state through an ordered consumer, the shadow, the events.
        sub = await js.subscribe(f"fleet.{ENV}.veh.*.state.>", ordered_consumer=True)
        await sub.unsubscribe()
        assert (await kv.get(shadow_key(ENV, "VID-002", "desired"))).value
        # Fleet rollouts (docs/rollout.md): their state in TWIN_ROLLOUTS, their events in the audit trail.
        rollouts = await js.key_value(ROLLOUTS_BUCKET)
        await rollouts.put(rollout_key(ENV, "r1"), b"{}")
        assert (await rollouts.get(rollout_key(ENV, "r1"))).value == b"{}"
        ack = await js.publish(rollout_event_subject(ENV, "r1", EventType.ROLLOUT_STARTED), b"x")
        assert ack.stream == EVENTS_STREAM
        ack = await js.publish(event_subject(ENV, "VID-002", EventType.ROLLOUT_VEHICLE), b"x")
        assert ack.stream == EVENTS_STREAM
        clean(op)

        for subj in (f"$JS.API.STREAM.DELETE.{EVENTS_STREAM}", f"$JS.API.STREAM.PURGE.{EVENTS_STREAM}",
                     f"$JS.API.STREAM.MSG.DELETE.{EVENTS_STREAM}", f"$JS.API.STREAM.UPDATE.{CMD_STREAM}",
                     f"$JS.API.CONSUMER.DELETE.{CMD_STREAM}.gw_VID-001"):
            await refused(op, subj, lambda s=subj: op.request(s, b"{}", timeout=JS_TIMEOUT_S))  # type: ignore[misc]
        rep = shadow_key(ENV, "VID-002", "reported")
        await refused(op, f"$KV.{SHADOW_BUCKET}.{rep}", lambda: kv.put(rep, b"{}"))
        forged = event_subject(ENV, "VID-002", "armed")
        await refused(op, forged, lambda: op.publish(forged, b""))
    finally:
        await op.close()


async def test_viewer_reads_state_events_shadow_only(hub: Secured) -> None:
    viewer, admin = await hub.connect("viewer"), await hub.connect("admin")
    try:
        await admin.jetstream().publish(state_subject(ENV, "VID-001", "battery"), envelope.pack("VID-001", 1_000_000_000, {}))
        await (await admin.jetstream().key_value(SHADOW_BUCKET)).put(shadow_key(ENV, "VID-001", "reported"), b"{}")
        js = viewer.jetstream(timeout=JS_TIMEOUT_S)
        sub = await js.subscribe(f"fleet.{ENV}.veh.*.state.>", ordered_consumer=True,
                                 deliver_policy=DeliverPolicy.LAST_PER_SUBJECT)
        msg = await sub.next_msg(timeout=2)
        assert msg.subject == state_subject(ENV, "VID-001", "battery")
        await sub.unsubscribe()
        ev = await js.subscribe(f"fleet.{ENV}.veh.*.evt.>", ordered_consumer=True)
        await ev.unsubscribe()
        kv = await js.key_value(SHADOW_BUCKET)
        assert (await kv.get(shadow_key(ENV, "VID-001", "reported"))).value == b"{}"
        clean(viewer)

        cmd = cmd_subject(ENV, "VID-001", "arm")
        await refused(viewer, cmd, lambda: viewer.publish(cmd, b"{}"))
        d = shadow_key(ENV, "VID-001", "desired")
        await refused(viewer, f"$KV.{SHADOW_BUCKET}.{d}", lambda: kv.put(d, b"{}"))
        await refused(viewer, f"$JS.API.CONSUMER.CREATE.{CMD_STREAM}",
                      lambda: js.subscribe(f"fleet.{ENV}.veh.*.cmd.>", ordered_consumer=True))
        await refused(viewer, f"$JS.API.STREAM.INFO.OBJ_{BLOBS_BUCKET}", lambda: js.object_store(BLOBS_BUCKET))
    finally:
        await viewer.close()
        await admin.close()


async def test_analytics_reads_events_only(hub: Secured) -> None:
    an, admin = await hub.connect("analytics"), await hub.connect("admin")
    try:
        await admin.jetstream().publish(event_subject(ENV, "VID-001", "armed"), _event("VID-001", "armed"))
        js = an.jetstream(timeout=JS_TIMEOUT_S)
        sub = await js.subscribe(f"fleet.{ENV}.veh.*.evt.>", ordered_consumer=True)
        msg = await sub.next_msg(timeout=2)
        assert msg.subject == event_subject(ENV, "VID-001", "armed")
        await sub.unsubscribe()
        clean(an)

        await refused(an, f"$JS.API.CONSUMER.CREATE.{STATE_STREAM}",
                      lambda: js.subscribe(f"fleet.{ENV}.veh.*.state.>", ordered_consumer=True))
        await refused(an, f"$JS.API.STREAM.INFO.{KV_STREAM}", lambda: js.key_value(SHADOW_BUCKET))
        ev = event_subject(ENV, "VID-001", "armed")
        await refused(an, ev, lambda: an.publish(ev, b""))
    finally:
        await an.close()
        await admin.close()


async def test_admin_administers(hub: Secured) -> None:
    admin = await hub.connect("admin")
    try:
        js = admin.jetstream()
        await js.purge_stream(STATE_STREAM)
        names = {s.config.name for s in await js.streams_info()}
        assert {STATE_STREAM, EVENTS_STREAM, CMD_STREAM, KV_STREAM} <= names
        clean(admin)
    finally:
        await admin.close()


async def test_unknown_identity_is_refused(secured: Secured) -> None:
    """No credential, no connection: the server has no anonymous user (spoken raw: nats-py leaks the socket)."""
    async with await anyio.connect_tcp(secured.server.host, secured.server.port) as s:
        assert (await s.receive()).startswith(b"INFO ")
        await s.send(b'CONNECT {"verbose":false,"pedantic":false,"protocol":1}\r\nPING\r\n')
        with anyio.fail_after(5):
            reply = await s.receive()
    assert b"-ERR 'Authorization Violation'" in reply


async def test_analytics_source_reads_the_audit_trail_with_its_credential(hub: Secured) -> None:
    """The Spark source's reader (analytics/natsread.py) under analytics.creds: range, time cut, rows."""
    from mavjet.analytics.natsread import iter_range
    from mavjet.analytics.natsread import run as resolve
    from mavjet.analytics.options import SourceOptions

    admin = await hub.connect("admin")
    try:
        for vid in ("VID-001", "VID-002"):
            await admin.jetstream().publish(event_subject(ENV, vid, "armed"), _event(vid, "armed"))
    finally:
        await admin.close()
    opts = SourceOptions(url=hub.server.url, creds=hub.creds("analytics"), start_time_us=1, timeout_s=10.0)

    def read() -> int:
        lo, hi = resolve(opts)
        return sum(len(batch[0]) for batch in iter_range(opts, lo, hi))

    assert await anyio.to_thread.run_sync(read) == 2
    assert "Violation" not in hub.log()


async def test_vehicle_holds_only_its_own_lease(hub: Secured) -> None:
    """Ownership (docs/ownership.md): a credential keeps its own vehicle's lease and commands in flight, nobody else's."""
    v1, v2 = await hub.connect("VID-001"), await hub.connect("VID-002")
    try:
        store1 = JetStreamLeaseStore(lambda: v1.jetstream(timeout=JS_TIMEOUT_S), timeout_s=JS_TIMEOUT_S)
        store2 = JetStreamLeaseStore(lambda: v2.jetstream(timeout=JS_TIMEOUT_S), timeout_s=JS_TIMEOUT_S)
        mine = lease_key(ENV, "VID-001")
        rev = await store1.write(mine, b'{"holder": "vid-001"}', last=0)
        assert (await store1.get(mine)).revision == rev
        cmd = inflight_key(ENV, "VID-001", "c1")
        assert await store1.write(cmd, b"x", last=0) > rev
        heard = await v1.subscribe(lease_kv_subject(mine))  # a release wakes a standby at once
        await heard.unsubscribe()
        clean(v1)
        # Hostile: VID-002 takes over VID-001's lease, deletes it, reads it, forges a command in flight.
        await refused(v2, lease_kv_subject(mine), lambda: store2.write(mine, b'{"holder": "x"}', last=rev))
        await refused(v2, lease_kv_subject(mine), lambda: store2.delete(mine, last=rev))
        await refused(v2, f"$JS.API.DIRECT.GET.KV_{LEASES_BUCKET}.{lease_kv_subject(mine)}",
                      lambda: store2.get(mine))
        await refused(v2, lease_kv_subject(cmd), lambda: store2.write(cmd, b"y", last=0))
        await refused(v2, lease_kv_subject(mine), lambda: v2.subscribe(lease_kv_subject(mine)))
        assert (await store1.get(mine)).revision == rev
    finally:
        for nc in (v1, v2):
            await nc.close()
