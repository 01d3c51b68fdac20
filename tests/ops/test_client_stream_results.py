"""`CommandClient(results_from_stream=True)`: results read from TWIN_EVENTS, as an issuer at a central cluster must.

At a central cluster over leaf hubs a hub's events reach the centre only
through the centre's sourced TWIN_EVENTS (docs/deploy.md, "Central cluster
over leaf hubs"); tests/deploy/test_central_hubs.py runs that for real. Here,
on one real server: a result stored in TWIN_EVENTS reaches the waiter, one
stored before the client started does not (it reads from now on), and the
client's subscription is a stream consumer, not a core one.
"""

from __future__ import annotations

import time

import pytest
from nats.aio.client import Client

from mavjet.contract import envelope
from mavjet.contract.subjects import event_subject
from mavjet.ops.client import CommandClient, ResultTimeout
from mavjet.ops.provision import DEFINITIONS_DIR, load_definitions, provision

ENV = "test"


async def _store_result(nc: Client, vid: str, cmd_id: str) -> None:
    data = {"cmd_id": cmd_id, "name": "set_mode", "result": "accepted", "attempts": 1}
    await nc.jetstream().publish(event_subject(ENV, vid, "cmd_result"), envelope.pack(vid, time.time_ns(), data),
                                 headers={"Nats-Msg-Id": f"{vid}:{cmd_id}:result"})


async def test_results_come_from_the_events_stream(nc: Client) -> None:
    defs = [d for d in load_definitions(DEFINITIONS_DIR, env=ENV, replicas=1, size="small") if d.name == "TWIN_EVENTS"]
    await provision(nc.jetstream(), defs)
    await _store_result(nc, "VID-001", "before")
    async with CommandClient(nc, ENV, results_from_stream=True) as client:
        assert client.results_from_stream
        await _store_result(nc, "VID-001", "c1")
        r = await client.wait("c1", 5.0, vid="VID-001")
        assert (r.vid, r.cmd_id, r.result) == ("VID-001", "c1", "accepted")
        with pytest.raises(ResultTimeout):  # stored before the client started: not a result it waits for
            await client.wait("before", 0.5)
