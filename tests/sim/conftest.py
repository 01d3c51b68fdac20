"""Fixtures for the simulator's tests: one vehicle and a ground station on it (helpers: `tests.support.sim`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from mavjet.sim.fleet import SimFleet
from tests.support.sim import MavClient, running


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    """One ArduCopter at 10x speed on a free port."""
    async with running() as f:
        yield f


@pytest.fixture
async def gcs(fleet: SimFleet) -> AsyncIterator[MavClient]:
    client = await MavClient.connect(fleet.endpoints[0])
    try:
        yield client
    finally:
        await client.close()
