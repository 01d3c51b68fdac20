"""Shared fixtures: a real nats-server with JetStream on a free loopback port."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client

from mavjet.contract.natsconn import open_client
from mavjet.ops.natsserver import NatsServer
from mavjet.ops.provision import DEFINITIONS_DIR, load_definitions, provision

# Spark sessions in tests start without the JVM class-data archive (analytics/classcache.py): the suite
# must not write a 160 MB archive into the user's cache, nor wait for its dump at exit.
# tests/analytics/test_startup.py exercises the archive in a temporary cache dir.
os.environ.setdefault("MAVJET_JVM_CLASS_CACHE", "off")


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A fresh nats-server per test; `restart()` keeps port and data."""
    srv = NatsServer(store_dir=str(tmp_path / "js"), log_file=str(tmp_path / "nats.log"))
    srv.start()
    try:
        yield srv
    finally:
        srv.cleanup()


@pytest.fixture
async def nc(nats_server: NatsServer) -> AsyncIterator[Client]:
    client = await open_client(nats_server.url, connect_timeout=2, max_reconnect_attempts=5)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def provisioned(nc: Client) -> Client:
    """The twin's resources exist (env `test`)."""
    await provision(nc.jetstream(), load_definitions(DEFINITIONS_DIR, env="test", replicas=1))
    return nc
