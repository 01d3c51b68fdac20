"""A real 3-node JetStream cluster on loopback, for the deploy tests (fixtures in tests/deploy/conftest.py)."""

from __future__ import annotations

from dataclasses import dataclass

from nats.aio.client import Client

from mavjet.ops.natsserver import NatsServer
from tests.support.wait import WaitTimeout, wait_for_async

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


async def wait_jetstream_ready(nc: Client, timeout_s: float = CLUSTER_READY_S) -> None:
    """Poll until the cluster has a JetStream meta leader (account_info answers)."""
    js = nc.jetstream(timeout=2)

    async def answers() -> bool:
        await js.account_info()
        return True

    try:
        # No meta leader yet: timeouts, 503s.
        await wait_for_async(answers, timeout_s, 0.25, what="JetStream cluster ready", ignore=(Exception,))
    except WaitTimeout as exc:
        raise TimeoutError(f"JetStream cluster not ready within {timeout_s}s: {exc}") from None


__all__ = ["CLUSTER_READY_S", "NatsCluster", "cluster_config", "wait_jetstream_ready"]
