"""The spool over its bound on a real nats-server outage: a command result outlives another vehicle's flood."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
from nats.aio.client import Client

from mavjet.contract import envelope
from mavjet.contract.natsconn import open_client
from mavjet.contract.subjects import event_subject
from mavjet.gateway.twin.budget import EventBudgetConfig
from mavjet.ops.natsserver import NatsServer
from mavjet.sim.fleet import SimConfig, SimFleet
from tests.support import ENV, collect_events, gateway_config, running_gateway, wait_for

BOUND = 100
FLOOD = 1000


async def test_cmd_result_survives_another_vehicles_flood_during_an_outage(
    provisioned: Client, nats_server: NatsServer, tmp_path: Path
) -> None:
    async with SimFleet(SimConfig(vehicles=2, base_port=0, speedup=4.0)) as fleet:
        # A budget far above the flood, so the flood reaches the spool (as garbage that passed it would).
        cfg = gateway_config(nats_server.url, fleet.endpoints, tmp_path / "state", spool_max_events=BOUND,
                             event_budget=EventBudgetConfig(rate_per_s=10_000.0, burst=10 * FLOOD))
        async with running_gateway(cfg) as gw:
            await wait_for(lambda: gw.publisher.is_connected and gw.publisher.state_published > 20, 20)
            await wait_for(lambda: gw.spool.depth == 0, 10)
            nats_server.stop()
            await wait_for(lambda: not gw.publisher.is_connected, 10)

            # VID-001's command ends during the outage: its result is handed to the spool as the executor does.
            msg_id = "VID-001:cmd_result:outage-1"
            data = {"cmd_id": "outage-1", "name": "arm", "result": "accepted"}
            gw.publisher.enqueue_event(event_subject(ENV, "VID-001", "cmd_result"), msg_id,
                                       envelope.pack("VID-001", time.time_ns(), data))
            await gw.publisher.flush_pending_to_spool()

            # VID-002 floods statustext in bursts, each written to the spool on its own.
            flooder = gw.twins["VID-002"]
            for burst in range(10):
                for i in range(FLOOD // 10):
                    flooder.emit("statustext", severity=6, severity_name="info", text=f"flood {burst}-{i}")
                await anyio.sleep(0.02)
            await wait_for(lambda: gw.spool.dropped >= FLOOD - BOUND, 10)
            assert gw.spool.depth == BOUND
            assert gw.spool.dropped_by_class["cmd_result"] == 0 and gw.spool.episodes == 1
            dropped = gw.metrics.registry.get_sample_value
            assert (dropped("mavjet_spool_dropped_total", {"class": "info"}) or 0) >= FLOOD - BOUND
            assert dropped("mavjet_spool_dropped_total", {"class": "cmd_result"}) == 0

            nats_server.start()
            await wait_for(lambda: gw.publisher.is_connected, 30)
            await wait_for(lambda: gw.spool.depth == 0, 30)
            assert gw.spool.episode is None  # drained below the bound: the episode is over

    nc = await open_client(nats_server.url)
    try:
        events = await collect_events(nc)
    finally:
        await nc.close()
    results = [(v, d) for v, t, d, m in events if t == "cmd_result" and m == msg_id]
    assert results == [("VID-001", data)]  # published once
    floods = [d["text"] for v, t, d, _ in events if v == "VID-002" and str(d.get("text", "")).startswith("flood")]
    assert 0 < len(floods) < BOUND
    assert floods == sorted(floods, key=lambda s: tuple(int(x) for x in s.split()[1].split("-")))  # in order
    assert floods[-1] == f"flood 9-{FLOOD // 10 - 1}"  # the newest were kept
