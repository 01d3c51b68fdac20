"""Sim + in-process gateway fixtures for the telemetry tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from mavjet.sim.fleet import SimConfig, SimFleet


@pytest.fixture
async def fleet3() -> AsyncIterator[SimFleet]:
    async with SimFleet(SimConfig(vehicles=3, base_port=0, speedup=4.0)) as fleet:
        yield fleet
