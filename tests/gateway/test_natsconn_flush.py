"""`flush()` on mavjet's connections ends only after the server has every command sent before it.

nats-py 2.16 writes its PING past the commands still in the write buffer, so
a SUB made just before `flush()` could reach the server after the PONG, and a
publish on another connection in between was never delivered to it.
"""

from __future__ import annotations

import anyio
from nats.aio.client import Client

from mavjet.contract.natsadapter import OrderedFlushClient
from mavjet.contract.natsconn import open_client
from mavjet.ops.natsserver import NatsServer
from tests.support.natsorder import ordered_deliveries

ROUNDS = 200


def test_the_private_names_the_override_relies_on_are_there() -> None:
    nc = OrderedFlushClient()
    for name in ("_pongs", "_pending", "_pending_data_size"):
        assert hasattr(nc, name), name
    assert callable(getattr(Client, "_flush_pending", None)) and callable(getattr(Client, "_send_ping", None))


async def test_a_subscription_flushed_on_one_connection_sees_the_next_publish_on_another(
        nats_server: NatsServer) -> None:
    """Each round: subscribe to a fresh subject, flush, publish from a second connection: all arrive."""
    watcher = await open_client(nats_server.url)
    publisher = await open_client(nats_server.url)
    assert isinstance(watcher, OrderedFlushClient)
    try:
        seen = await ordered_deliveries(watcher, publisher, rounds=ROUNDS, prefix="flush.order")
    finally:
        await watcher.close()
        await publisher.close()
    assert seen == ROUNDS


async def test_keepalive_pings_still_answered(nats_server: NatsServer) -> None:
    """The client's own PINGs go through the same path: a short ping interval keeps the connection up."""
    nc = await open_client(nats_server.url, ping_interval=0.05, max_outstanding_pings=2)
    try:
        await anyio.sleep(0.5)
        assert nc.is_connected and nc._pings_outstanding <= 2
        rtt = await nc.rtt()
        assert rtt < 5
    finally:
        await nc.close()
