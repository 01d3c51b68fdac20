"""Fixtures for the shadow tests: one simulated vehicle behind a gateway running the shadow service."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client

from mavjet.sim.fleet import SimConfig, SimFleet
from tests.shadow.harness import Shadowed, shadowed


@pytest.fixture
async def fleet1() -> AsyncIterator[SimFleet]:
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=4.0)) as fleet:
        yield fleet


@pytest.fixture
async def sh(provisioned: Client, nats_server: Any, fleet1: SimFleet, tmp_path: Path) -> AsyncIterator[Shadowed]:
    async with shadowed(provisioned, nats_server.url, fleet1, tmp_path / "state") as s:
        yield s
