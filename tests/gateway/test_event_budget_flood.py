"""A vehicle flooding STATUSTEXT gets a bounded number of events plus `events_suppressed`.

Real nats-server, in-process gateway, two sim vehicles: VID-001 sends
thousands of warnings in two seconds (as a misbehaving autopilot or garbage
frames carrying its sysid would), VID-002 sends a few. VID-001's events in
TWIN_EVENTS stay within its budget and the rest is summarised; VID-002's
events and both vehicles' state are untouched.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from nats.aio.client import Client
from nats.js import JetStreamContext

from mavjet.drivers.mavlink.dialect import mavlink2 as m
from mavjet.gateway.twin.budget import EventBudgetConfig
from mavjet.gateway.twin.telemetry import Event
from mavjet.ops.natsserver import NatsServer
from mavjet.sim.fleet import SimConfig, SimFleet
from tests.support import ENV, collect_events, gateway_config, running_gateway, wait_for

FLOOD_TICKS = 40  # x 50 ms = 2 s
PER_TICK = 100
CALM = 20


async def _positions(js: JetStreamContext, vid: str) -> int:
    subject = f"fleet.{ENV}.veh.{vid}.state.position"
    info = await js.stream_info("TWIN_STATE", subjects_filter=subject)
    return int((info.state.subjects or {}).get(subject, 0))


async def test_flood_is_bounded_and_summarised_others_unaffected(
    provisioned: Client, nats_server: NatsServer, tmp_path: Path
) -> None:
    budget = EventBudgetConfig(rate_per_s=20.0, burst=100, window_s=1.0)
    js = provisioned.jetstream()
    seen: dict[str, int] = {"VID-001": 0, "VID-002": 0}
    async with SimFleet(SimConfig(vehicles=2, base_port=0, speedup=2.0)) as fleet:
        noisy, calm = fleet.vehicles
        cfg = gateway_config(nats_server.url, fleet.endpoints, tmp_path / "state", event_budget=budget)
        async with running_gateway(cfg) as gw:
            for vid in seen:
                def count(ev: Event, vid: str = vid) -> None:
                    if ev.type == "statustext" and str(ev.data.get("text", "")).startswith("flood"):
                        seen[vid] += 1

                gw.twins[vid].subscribe(count)
            await wait_for(lambda: all(t.model.channels.get("position") for t in gw.twins.values()), 20)
            await asyncio.sleep(1.0)
            pos_before = {vid: await _positions(js, vid) for vid in seen}
            t0 = time.monotonic()
            for i in range(FLOOD_TICKS):
                # The sim's own STATUSTEXT path: framed with the vehicle's sysid, sent on its next tick.
                for j in range(PER_TICK):
                    noisy._text(m.MAV_SEVERITY_WARNING, f"flood {i}.{j}")
                if i % 2 == 0 and i // 2 < CALM:
                    calm._text(m.MAV_SEVERITY_WARNING, f"flood calm {i // 2}")
                await asyncio.sleep(0.05)
            await wait_for(lambda: seen["VID-001"] == FLOOD_TICKS * PER_TICK and seen["VID-002"] == CALM, 20)
            flood_s = time.monotonic() - t0
            pos_after = {vid: await _positions(js, vid) for vid in seen}
            await asyncio.sleep(1.5)  # a window closes: its summary goes out without the gateway stopping
            suppressed_metric = gw.metrics.events_suppressed.labels(type="statustext")._value.get()
            live_summaries = sum(1 for ev in await collect_events(provisioned) if ev[1] == "events_suppressed")
        events = await collect_events(provisioned)

    def of(vid: str, etype: str) -> list[dict[str, Any]]:
        return [d for v, t, d, _ in events if v == vid and t == etype]

    flood_pub = [d for d in of("VID-001", "statustext") if d["text"].startswith("flood")]
    summaries = of("VID-001", "events_suppressed")
    suppressed = sum(d["count"] for d in summaries if d["event_type"] == "statustext")
    injected = FLOOD_TICKS * PER_TICK
    # Bounded: the burst plus the refill over the flood, not thousands.
    assert 100 <= len(flood_pub) <= 100 + 20 * (flood_s + 2), (len(flood_pub), flood_s)
    assert len([1 for v, *_ in events if v == "VID-001"]) < 400
    # Every held-back event is accounted for, in a few summaries (one per 1 s window).
    assert suppressed == suppressed_metric
    assert injected <= len(flood_pub) + suppressed <= injected + 10, (len(flood_pub), suppressed)
    assert 1 <= len(summaries) <= flood_s / budget.window_s + 3, summaries
    assert all(d["window_s"] >= budget.window_s for d in summaries[:-1])
    assert live_summaries >= 1
    # In-gateway subscribers saw every event; VID-002 lost nothing.
    assert seen == {"VID-001": injected, "VID-002": CALM}
    assert len([d for d in of("VID-002", "statustext") if d["text"].startswith("flood calm")]) == CALM
    assert of("VID-002", "events_suppressed") == []
    # State kept flowing at the position rate (10 Hz) for both vehicles during the flood.
    for vid in seen:
        rate = (pos_after[vid] - pos_before[vid]) / flood_s
        assert rate >= 6.0, (vid, rate)
