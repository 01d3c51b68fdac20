"""A simulated vehicle and the real `MavlinkLink` to it over loopback TCP."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace

import anyio

from mavjet.drivers.mavlink.command import CommandConfig
from mavjet.drivers.mavlink.link import LinkConfig, MavlinkLink
from mavjet.drivers.mavlink.mission import MissionConfig
from mavjet.drivers.mavlink.params import ParamConfig
from mavjet.drivers.mavlink.runner import ProtocolConfig
from mavjet.drivers.mavlink.transport import Endpoint
from mavjet.sim.fleet import SimConfig, SimFleet
from mavjet.sim.vehicle import SimVehicle
from tests import support

#: Timeouts for tests: short enough to keep retries quick, long enough for a loaded 2-core box.
FAST = ProtocolConfig(
    command=CommandConfig(ack_timeout_s=0.5, max_attempts=3, in_progress_timeout_s=10.0),
    mission=MissionConfig(item_timeout_s=0.5, max_retries=6),
    params=ParamConfig(timeout_s=0.5, max_attempts=4),
    heartbeat_wait_s=3.0,
    operation_timeout_s=40.0,
)

#: For 20% loss both ways an exchange fails with p = 1 - 0.8 * 0.8 = 0.36; 12 consecutive
#: failures (0.36**13 ~ 2e-6 per exchange) keep these tests from flaking.
LOSSY = replace(
    FAST,
    mission=MissionConfig(item_timeout_s=0.5, max_retries=12),
    params=ParamConfig(timeout_s=0.5, max_attempts=12),
    operation_timeout_s=50.0,
)


@asynccontextmanager
async def sim_link(config: SimConfig | None = None) -> AsyncIterator[tuple[MavlinkLink, SimVehicle]]:
    """One sim vehicle and a connected, heartbeat-ready link to it."""
    cfg = config or SimConfig(vehicles=1, base_port=0, speedup=5.0)
    async with SimFleet(cfg) as fleet:
        link = MavlinkLink(
            name="veh1",
            endpoint=Endpoint.parse(fleet.endpoints[0]),
            config=LinkConfig(heartbeat_timeout_s=5.0),
            on_messages=lambda msgs, recv_ns: None,
        )
        try:
            async with anyio.create_task_group() as tg:
                await tg.start(link.run)
                with anyio.fail_after(15):
                    await link.wait_ready()
                try:
                    yield link, fleet.vehicles[0]
                finally:
                    tg.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # Show the test's own failure, not anyio's wrapper around it.
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise


async def wait_for(cond: Callable[[], bool], timeout_s: float = 15.0, what: str = "condition") -> None:
    """The one bounded wait (`tests.support.wait_for`), with `what` third as the driver tests write it."""
    await support.wait_for(cond, timeout_s, what=what)
