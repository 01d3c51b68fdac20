"""`flush()` on mavjet's connections ends only after the server has every command sent before it.

nats-py 2.16 writes its PING past the commands still in the write buffer, so
a SUB made just before `flush()` could reach the server after the PONG, and a
publish on another connection in between was never delivered to it.
"""

from __future__ import annotations

from pathlib import Path

import anyio
from nats.aio.client import Client

from mavjet.contract.natsadapter import OrderedFlushClient
from mavjet.contract.natsconn import close, open_client
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


async def test_closing_a_connection_whose_server_went_first_does_not_raise(tmp_path: Path) -> None:
    """What a Ctrl-C to `mavjet demo`'s process group does: the server dies, then each client closes."""
    server = NatsServer(store_dir=str(tmp_path / "js"))
    server.start()
    try:
        ncs = [await open_client(server.url, connect_timeout=2) for _ in range(5)]
        for nc in ncs:
            await nc.publish("x", b"y" * 65536)  # something still in the write buffer when the socket goes
        server.stop(kill=True)
        for nc in ncs:
            why = await close(nc)
            assert nc.is_closed, why
    finally:
        server.cleanup()
