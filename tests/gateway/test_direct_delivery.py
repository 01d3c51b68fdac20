"""Acks handed over in nats-py's read task, state written to the socket at once: against a real nats-server.

`subscribe_direct` and `natsadapter.write_commands` each save the gateway one pass of
its event loop (gateway/publish/statepub.py). The rules under test: every message
still arrives, in order; a handler that raises costs only its own message;
and a server that stops reading gets its bytes through nats-py's flusher,
which waits for the socket, instead of through the transport's buffer.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import anyio
import pytest
from nats.aio.client import Client

from mavjet.contract import natsadapter
from mavjet.contract.natsconn import open_client
from mavjet.gateway.publish.statepub import DirectDelivery, RawPublish, subscribe_direct
from mavjet.ops.natsserver import NatsServer


async def test_direct_delivery_hands_every_message_over_in_order_and_survives_a_failing_handler(
        nats_server: NatsServer, nc: Client) -> None:
    got: list[bytes] = []

    def handler(msg: Any) -> None:
        if msg.data == b"5":
            raise ValueError("a bad ack")
        got.append(msg.data)

    assert await subscribe_direct(nc, "acks.*", handler) is True
    sub = next(s for s in nc._subs.values() if s.subject == "acks.*")
    delivery = sub._pending_queue
    assert isinstance(delivery, DirectDelivery)
    assert sub._wait_for_msgs_task is None  # no task of its own: the read task calls the handler

    sender = await open_client(nats_server.url)
    try:
        for i in range(100):
            await sender.publish(f"acks.{i}", str(i).encode())
        await sender.flush()
        with anyio.fail_after(10):
            while len(got) < 99:  # bounded by fail_after
                await anyio.sleep(0.01)
    finally:
        await sender.close()
    assert got == [str(i).encode() for i in range(100) if i != 5]
    assert delivery.failures == 1
    # The read task lived on: the connection still answers.
    assert nc.is_connected
    await nc.flush(timeout=5)
    await sub.unsubscribe()


async def test_state_goes_to_the_socket_at_once_and_through_the_flusher_while_the_server_stalls(
        nats_server: NatsServer, nc: Client) -> None:
    raw = RawPublish({"Content-Type": "application/msgpack"})
    counted = 0
    done = anyio.Event()
    chunk = b"x" * (256 * 1024)

    async def count(msg: Any) -> None:
        nonlocal counted
        counted += 1
        if msg.subject == "bulk.end":
            done.set()

    watcher = await open_client(nats_server.url)
    assert nats_server.proc is not None
    pid = nats_server.proc.pid
    try:
        await watcher.subscribe("bulk.>", cb=count, pending_bytes_limit=256 * 1024 * 1024)
        await watcher.flush()

        await natsadapter.write_commands(nc, [raw.frame("bulk.first", b"1")])
        assert nc._pending == [] and nc._pending_data_size == 0  # on the socket, no flusher pass

        # A server that stops reading: the socket fills, then the transport buffers.
        writer = nc._transport._io_writer  # type: ignore[union-attr]
        sent = 1
        os.kill(pid, signal.SIGSTOP)
        try:
            for _ in range(256):  # 64 MiB at most; loopback buffers take a few
                if writer.transport.get_write_buffer_size() > 0:
                    break
                await natsadapter.write_commands(nc, [raw.frame("bulk.fill", chunk)])
                sent += 1
            else:
                pytest.fail("the socket never filled")
            await natsadapter.write_commands(nc, [raw.frame("bulk.late", b"late")])
            sent += 1
            # Left to the flusher, which waits for the socket to drain: nothing piles up in the transport.
            assert nc._pending and nc._pending_data_size > 0
        finally:
            os.kill(pid, signal.SIGCONT)
        await natsadapter.write_commands(nc, [raw.frame("bulk.end", b"end")])
        sent += 1
        with anyio.fail_after(30):
            await done.wait()
        assert counted == sent  # every message arrived, the last one last
    finally:
        await watcher.close()
