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

ROOT = Path(__file__).resolve().parent.parent

# `make test` runs two pytests side by side: `-m "not waits"` and `-m waits`. The second takes
# the tests whose time is spent outside pytest's own process: waiting on the wall clock (a cut
# link, retries, elections, a simulated flight), or in child processes (a mypyc build, a JVM,
# a whole benchmark run). Measured (pytest --durations) on a 2-core machine, these ~60 tests were
# ~11 of the suite's 21 minutes in one pytest; beside the rest both halves end in about half.
# A module listed here is marked `waits` whole; a test can also carry @pytest.mark.waits itself.
BESIDE_THE_REST: dict[str, str] = {
    "tests/ops/test_compile.py": "a mypyc build, then the hot modules' tests on it in a child pytest",
    "tests/test_bench_compare.py": "end-to-end comparisons, each with a mypyc build",
    "tests/test_bench_overload.py": "a knee search of ingest runs",
    "tests/analytics/test_replay.py": "a Spark standalone cluster and replay runs",
    "tests/analytics/test_bench.py": "the replay benchmark's stages in a JVM",
    "tests/analytics/test_startup.py": "JVM starts with and without the class-data archive",
    "tests/analytics/test_tracks.py": "replays with recorded tracks",
    "tests/analytics/test_gateway_replay.py": "a gateway's real events replayed by Spark",
    "tests/gateway/test_uplink_link.py": "traffic through a throttled link",
    "tests/gateway/test_staleness_process.py": "a killed gateway going stale (10 s)",
    "tests/gateway/test_tls_errors.py": "a gateway retrying a refused TLS handshake",
    "tests/gateway/test_redaction.py": "gateway processes retrying, their logs read",
    "tests/gateway/test_config_errors.py": "a gateway retrying an unreachable server",
    "tests/deploy/test_cluster.py": "a 3-node cluster's elections",
    "tests/deploy/test_cluster_gateway.py": "a gateway through a leader failover",
    "tests/commands/test_crash_stream.py": "gateways killed at random and restarted",
    "tests/ownership/test_paused_owner.py": "a gateway process stopped past its lease's TTL",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.relative_to(ROOT).as_posix() in BESIDE_THE_REST:
            item.add_marker(pytest.mark.waits)


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
