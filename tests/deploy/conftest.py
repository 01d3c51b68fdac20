"""Fixtures for the deploy tests: a real 3-node JetStream cluster on loopback."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client

from gateway.ops.natsserver import NatsServer, free_port

CLUSTER_READY_S = 45.0


@dataclass
class NatsCluster:
    nodes: list[NatsServer]
    names: list[str]

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    @property
    def url_list(self) -> str:
        return ",".join(self.urls)

    def node_named(self, name: str) -> NatsServer:
        return self.nodes[self.names.index(name)]


def cluster_config(name: str, cluster_port: int, route_ports: list[int]) -> str:
    routes = "\n".join(f'    "nats://127.0.0.1:{p}"' for p in route_ports)
    return (
        f"server_name: {name}\n"
        "jetstream { max_file_store: 1TB, max_memory_store: 256MB }\n"
        "cluster {\n"
        "  name: mavjet-test\n"
        f"  listen: 127.0.0.1:{cluster_port}\n"
        "  routes: [\n" + routes + "\n  ]\n"
        "}\n"
    )


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


async def wait_jetstream_ready(nc: Client, timeout_s: float = CLUSTER_READY_S) -> None:
    """Poll until the cluster has a JetStream meta leader (account_info answers)."""
    js = nc.jetstream(timeout=2)
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            await js.account_info()
            return
        except Exception as exc:  # no meta leader yet: timeouts, 503s
            last = exc
            await asyncio.sleep(0.25)
    raise TimeoutError(f"JetStream cluster not ready within {timeout_s}s: {last!r}")


@pytest.fixture
async def cluster_nc(nats_cluster: NatsCluster) -> AsyncIterator[Client]:
    """A client that knows every node and keeps reconnecting through failovers."""
    nc = await nats.connect(
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
