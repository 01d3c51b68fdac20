"""Real events: a simulated vehicle flown through the gateway, then replayed with Spark.

The sim vehicle speaks MAVLink over loopback TCP to the in-process gateway,
which publishes the audit trail to a real nats-server; the jobs must find the
one flight and its battery failsafe in what the gateway actually wrote.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from mavjet.analytics import jobs
from mavjet.contract.natsconn import open_client
from mavjet.ops.natsserver import NatsServer
from mavjet.ops.provision import DEFINITIONS_DIR, load_definitions, provision
from tests.analytics.support import read


async def _fly_with_battery_failsafe(url: str, state_dir: Path) -> None:
    from mavjet.drivers.mavlink.dialect import mavlink2 as m
    from mavjet.sim.fleet import SimConfig, SimFleet
    from tests.support import gateway_config, running_gateway, wait_for, wait_for_async

    nc = await open_client(url)
    try:
        await provision(nc.jetstream(), load_definitions(DEFINITIONS_DIR, env="test", replicas=1))
    finally:
        await nc.close()

    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=5.0)) as fleet:
        v = fleet.vehicles[0]
        cfg = gateway_config(url, fleet.endpoints, state_dir)
        async with running_gateway(cfg) as gw:
            twin = gw.twins["VID-001"]

            async def command(cmd: int, *params: float) -> None:
                p = list(params) + [0.0] * (7 - len(params))
                await twin.link.send(m.MAVLink_command_long_message(twin.link.target_system, 1, cmd, 0, *p))

            async def arm() -> bool:
                if not twin.model.armed:
                    await command(m.MAV_CMD_COMPONENT_ARM_DISARM, 1)
                    await asyncio.sleep(0.5)
                return bool(twin.model.armed)

            await wait_for(lambda: twin.model.fix_type == 3 and twin.model.home, 30)
            await asyncio.sleep(1.0)
            await command(m.MAV_CMD_DO_SET_MODE, 1, 4)  # GUIDED
            await wait_for(lambda: v.mode == "GUIDED", 10)
            await wait_for_async(arm, timeout_s=20)
            await command(m.MAV_CMD_NAV_TAKEOFF, 0, 0, 0, 0, 0, 0, 12)
            await wait_for(lambda: v.alt_m > 8.0, 30)
            v.set_battery_pct(5.0)
            await wait_for(lambda: twin.model.failsafe_active, 20)
            await wait_for(lambda: not v.armed, 60)  # the failsafe lands and disarms
            await asyncio.sleep(1.0)


def test_replay_of_real_gateway_events(spark: Any, nats_server: NatsServer, tmp_path: Path) -> None:
    asyncio.run(_fly_with_battery_failsafe(nats_server.url, tmp_path / "state"))
    events = read(spark, nats_server.url, subjects="fleet.test.veh.*.evt.>").cache()
    try:
        assert events.where("error is not null").count() == 0
        types = {r["type"] for r in events.select("type").distinct().collect()}
        assert {"armed", "takeoff", "failsafe", "landed", "disarmed"} <= types, types
        (flight,) = jobs.flights(events).collect()
        assert flight["vid"] == "VID-001" and flight["complete"]
        assert flight["max_alt_m"] > 8.0 and flight["duration_s"] > 0
        assert flight["failsafes"] >= 1 and "battery" in flight["failsafe_types"]
        assert "GUIDED" in flight["modes"]
        fs = [r for r in jobs.failsafe_events(events).collect() if r["failsafe_type"] == "battery"]
        assert fs and fs[0]["in_flight"] and fs[0]["time_to_landed_s"] is not None and fs[0]["time_to_landed_s"] > 0
        story = [r["type"] for r in jobs.timeline(events, "VID-001").collect()]
        assert story.index("armed") < story.index("takeoff") < story.index("failsafe") < story.index("disarmed")
    finally:
        events.unpersist()
