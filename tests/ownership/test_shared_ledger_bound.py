"""The shared ledger's memory of revisions is a bounded LRU: a key in use is kept, the oldest one goes.

Against a real nats-server (TWIN_LEASES): a key whose revision is remembered can be deleted by
compare-and-set; a forgotten one is left in the bucket (the careful path), never written blindly.
"""

from __future__ import annotations

import time
from pathlib import Path

from nats.aio.client import Client

from mavjet.contract.subjects import LEASES_STREAM, inflight_key, lease_kv_subject
from mavjet.gateway.commands.ledger import IN_FLIGHT, Ledger, LedgerEntry
from mavjet.gateway.commands.shared import SharedLedger
from mavjet.gateway.ownership.store import JetStreamLeaseStore
from tests.ownership.support import ENV, provision_leases

VID = "VID-001"


def _in_flight(cmd_id: str) -> LedgerEntry:
    return LedgerEntry(cmd_id=cmd_id, vid=VID, name="set_mode", result=IN_FLIGHT, subject=f"fleet.{ENV}.veh.{VID}.cmd",
                       msg_id=cmd_id, payload=b"", spooled=False, at_ns=time.time_ns())


async def _stored(nc: Client, cmd_id: str) -> bool:
    """Whether the command's row is in the bucket (a delete marker counts as gone)."""
    try:
        msg = await nc.jetstream().get_msg(LEASES_STREAM, subject=lease_kv_subject(inflight_key(ENV, VID, cmd_id)))
    except Exception:
        return False
    return (msg.headers or {}).get("KV-Operation") not in ("DEL", "PURGE")


async def test_revisions_are_an_lru_bounded_by_last_revisions(nc: Client, tmp_path: Path) -> None:
    await provision_leases(nc)
    local = Ledger(tmp_path / "ledger.sqlite")
    await local.open()
    shared = SharedLedger(local, JetStreamLeaseStore(nc.jetstream), env=ENV, holder="gw-test", token=lambda _: 1,
                          last_revisions=3)
    try:
        for cmd_id in ("a", "b", "c"):
            assert await shared.record(_in_flight(cmd_id))
        await shared.clear_in_flight(VID, "a")  # used again: now the newest of the three
        assert not await _stored(nc, "a")
        assert await shared.record(_in_flight("d"))  # one over the bound: the least recently used (b) goes
        assert shared.remembered == 3
        await shared.clear_in_flight(VID, "b")  # forgotten: left in the bucket for a careful redelivery
        assert await _stored(nc, "b")
        for cmd_id in ("c", "d"):  # remembered: deleted by compare-and-set
            await shared.clear_in_flight(VID, cmd_id)
            assert not await _stored(nc, cmd_id)
        for i in range(10):  # however many come, the memory stays within its bound
            assert await shared.record(_in_flight(f"n{i}"))
            assert shared.remembered <= 3
    finally:
        shared.close()
        local.close()
