"""The fleet's tick looks at the sockets between chunks of vehicles: a command never waits for a whole fleet's step."""

from __future__ import annotations

import asyncio

import pytest

import sim.fleet
from sim.fleet import SimConfig, SimFleet
from sim.vehicle import SimVehicle


async def test_a_tick_of_many_vehicles_lets_other_work_run_between_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sim.fleet, "TICK_CHUNK", 2)
    passes = 0
    seen: list[tuple[int, int]] = []  # (vehicle sysid, passes of the other task when it was stepped)
    real_tick = SimVehicle.tick

    def tick(self: SimVehicle, sim_now: float, wall: float) -> None:
        seen.append((self.sysid, passes))
        real_tick(self, sim_now, wall)

    monkeypatch.setattr(SimVehicle, "tick", tick)

    async def other_work() -> None:
        nonlocal passes
        for _ in range(100_000):  # bounded
            passes += 1
            await asyncio.sleep(0)

    async with SimFleet(SimConfig(vehicles=5, base_port=0, speedup=1.0, tick_s=0.05)):
        probe = asyncio.create_task(other_work())
        for _ in range(100):  # bounded: until a few ticks ran
            if len(seen) >= 15:
                break
            await asyncio.sleep(0.02)
        probe.cancel()
    ticks = [seen[i:i + 5] for i in range(0, len(seen) - len(seen) % 5, 5)]
    assert len(ticks) >= 2
    for t in ticks[1:]:  # the first tick may start before the other task does
        counts = [p for _, p in t]
        # Vehicles 1-2 in one chunk, 3-4 in the next, 5 in the last: the other task ran between chunks,
        # never inside one.
        assert counts[0] == counts[1] < counts[2] == counts[3] < counts[4], counts
