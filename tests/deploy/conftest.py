"""Fixtures for the deploy tests: a real 3-node JetStream cluster on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client

from mavjet.contract.natsconn import open_client
from mavjet.ops.natsserver import NatsServer, free_port
from tests.support.cluster import NatsCluster, cluster_config, wait_jetstream_ready


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    """Three nats-servers clustered over loopback routes, JetStream on each.

    Each node keeps its port and store across `stop()`/`start()`, so a test can
    kill one and bring it back as the same cluster member.
    """
    names = ["n1", "n2", "n3"]
    cluster_ports = [free_port() for _ in names]
    nodes: list[NatsServer] = []
    for i, name in enumerate(names):
        d = tmp_path / name
        d.mkdir()
        conf = d / "node.conf"
        conf.write_text(cluster_config(name, cluster_ports[i], cluster_ports))
        nodes.append(
            NatsServer(
                store_dir=str(d / "js"),
                config_file=str(conf),
                log_file=str(d / "nats.log"),
                ready_timeout_s=30.0,
            )
        )
    try:
        for n in nodes:
            n.start()
        yield NatsCluster(nodes=nodes, names=names)
    finally:
        for n in nodes:
            n.cleanup()


@pytest.fixture
async def cluster_nc(nats_cluster: NatsCluster) -> AsyncIterator[Client]:
    """A client that knows every node and keeps reconnecting through failovers."""
    nc = await open_client(
        servers=nats_cluster.urls,
        connect_timeout=2,
        reconnect_time_wait=0.2,
        max_reconnect_attempts=-1,
        dont_randomize=True,
    )
    try:
        await wait_jetstream_ready(nc)
        yield nc
    finally:
        await nc.close()
