"""Presence under the permission matrix (ops/auth.py) on a real nats-server with `mavjet auth` credentials.

A vehicle (or hub) identity writes its own vehicles' presence records and nobody else's; `viewer` and
`operator` read leases and presence records, and not the commands in flight beside them.
"""

from __future__ import annotations

from nats.aio.client import Client

from mavjet.contract.subjects import LEASES_STREAM, lease_key, lease_kv_subject, presence_key
from mavjet.gateway.ownership.lease import LeaseValue, encode_value
from mavjet.gateway.ownership.presence import PresenceValue, encode_presence
from mavjet.gateway.ownership.store import JetStreamLeaseStore
from mavjet.ops.read import read_lease, read_presence
from tests.security.conftest import ENV, Secured, hub, secured
from tests.security.support import clean, refused

__all__ = ["hub", "secured"]  # the fixtures, from tests/security

JS_TIMEOUT_S = 2.0


def _record(holder: str) -> bytes:
    return encode_presence(PresenceValue(holder=holder, instance=holder.partition("@")[0], host="h", pid=1,
                                         role="standby", owner="gw-a@h:1:aa", link="up", active_link=None,
                                         since="s", updated_at="u", period_s=5.0))


def _store(nc: Client) -> JetStreamLeaseStore:
    return JetStreamLeaseStore(lambda: nc.jetstream(timeout=JS_TIMEOUT_S), timeout_s=JS_TIMEOUT_S)


async def test_own_presence_written_read_by_viewer_and_operator_only_that(hub: Secured) -> None:
    v1, v2, gw = await hub.connect("VID-001"), await hub.connect("VID-002"), await hub.connect("hub")
    viewer, operator = await hub.connect("viewer"), await hub.connect("operator")
    try:
        mine, hubs = presence_key(ENV, "VID-001", "gw-b-bb"), presence_key(ENV, "VID-003", "gw-h-hh")
        await _store(v1).put(mine, _record("gw-b@h:2:bb"))
        await _store(gw).put(hubs, _record("gw-h@h:3:hh"))
        await _store(v1).write(lease_key(ENV, "VID-001"), encode_value(LeaseValue(
            holder="gw-a@h:1:aa", instance="gw-a", host="h", pid=1, since="s")), last=0)
        await _store(v1).remove(mine)  # a clean stop
        await _store(v1).put(mine, _record("gw-b@h:2:bb"))
        clean(v1)
        clean(gw)
        for reader in (viewer, operator):
            seen = await read_presence(reader, ENV)
            assert seen is not None and sorted(s.holder for s in seen) == ["gw-b@h:2:bb", "gw-h@h:3:hh"]
            one = await read_presence(reader, ENV, "VID-001")
            assert one is not None and [s.holder for s in one] == ["gw-b@h:2:bb"]
            owner = await read_lease(reader.jetstream(timeout=JS_TIMEOUT_S), ENV, "VID-001")
            assert owner is not None and owner.holder == "gw-a@h:1:aa"
            clean(reader)
        # Hostile: another vehicle writes VID-001's presence record; a viewer reads the commands in flight.
        await refused(v2, lease_kv_subject(mine), lambda: _store(v2).put(mine, _record("forged@h:9:ff")))
        js = viewer.jetstream(timeout=JS_TIMEOUT_S)
        await refused(viewer, f"$JS.API.CONSUMER.CREATE.{LEASES_STREAM}",
                      lambda: js.subscribe(lease_kv_subject(f"fleet.{ENV}.veh.*.cmd.>"), ordered_consumer=True))
    finally:
        for nc in (v1, v2, gw, viewer, operator):
            await nc.close()
