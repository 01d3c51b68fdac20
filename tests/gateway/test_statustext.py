"""Status text end to end: sim vehicle -> gateway -> TWIN_EVENTS.

The sim sends what ArduPilot sends: "Reached command #N" and
MISSION_ITEM_REACHED for the same item (one event), and the same PreArm line
again and again (collapsed into a first event and a counted summary per
window, closed by the gateway's link tick).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from nats.aio.client import Client

from mavjet.drivers.mavlink.dialect import mavlink2 as m
from mavjet.gateway.twin.telemetry import Event
from mavjet.ops.natsserver import NatsServer
from mavjet.sim.fleet import SimConfig, SimFleet
from tests.support import collect_events, gateway_config, running_gateway, wait_for

PREARM = "PreArm: Need Position Estimate"


async def test_reached_is_one_event_and_repeats_are_collapsed(
    provisioned: Client, nats_server: NatsServer, tmp_path: Path
) -> None:
    seen: list[Event] = []
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=1.0)) as fleet:
        v = fleet.vehicles[0]
        cfg = gateway_config(nats_server.url, fleet.endpoints, tmp_path / "state")
        async with running_gateway(cfg) as gw:
            gw.twins["VID-001"].subscribe(seen.append)
            gw.twins["VID-001"].model.texts.window_ns = 1_000_000_000  # 30 s in production
            await wait_for(lambda: gw.twins["VID-001"].model.mode is not None, 20)
            # ArduPilot: the text, then MISSION_ITEM_REACHED for the same item.
            v._text(m.MAV_SEVERITY_INFO, "Reached command #1")
            v._reached(1)
            await asyncio.sleep(0.3)
            # A waypoint followed by a DO_ item: the text names the waypoint, the message the DO_ item.
            v._text(m.MAV_SEVERITY_INFO, "Reached command #2")
            v._reached(3)
            v._text(m.MAV_SEVERITY_INFO, "Mission: 5 WP")
            for _ in range(5):
                v._text(m.MAV_SEVERITY_CRITICAL, PREARM)
                await asyncio.sleep(0.1)
            await wait_for(lambda: any(e.data.get("count") == 4 for e in seen if e.type == "statustext"), 10)
        events = await collect_events(provisioned)

    def of(etype: str) -> list[dict[str, object]]:
        return [d for vid, t, d, _ in events if t == etype]

    assert [d["seq"] for d in of("mission_item_reached")] == [1, 3]
    texts = [(d["text"], d["count"]) for d in of("statustext")]
    assert ("Mission: 5 WP", 1) in texts
    assert not any(str(t).startswith("Reached command") for t, _ in texts)
    assert [c for t, c in texts if t == PREARM] == [1, 4]
    # In-gateway subscribers saw every PreArm line (the repeats as internal events) plus the summary.
    assert [(e.data["count"], e.internal) for e in seen if e.data.get("text") == PREARM] == [
        (1, False), (1, True), (1, True), (1, True), (1, True), (4, False)]
