"""TCP links read through the loop's one epoll (drivers/mavlink/reactor.py), against real loopback sockets."""

from __future__ import annotations

import asyncio
from collections import Counter

import anyio
import pytest

from drivers.mavlink import reactor
from drivers.mavlink.reactor import Reactor, ReactorTransport
from drivers.mavlink.transport import Endpoint, open_transport
from gateway.contract.errors import LinkError

pytestmark = pytest.mark.skipif(not reactor.AVAILABLE, reason="epoll is Linux only")


async def _open(port: int) -> ReactorTransport:
    t = await open_transport(Endpoint.parse(f"tcp:127.0.0.1:{port}"), connect_timeout_s=2)
    assert isinstance(t, ReactorTransport)
    return t


async def test_links_are_read_a_slice_per_pass_each_into_its_own_sink(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reactor, "MAX_READS_PER_PASS", 4)
    n = 20
    finished = 0

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        nonlocal finished
        i = (await r.readexactly(3)).decode()
        w.write(f"hello-{i}".encode())
        await w.drain()
        await r.read()  # until the client closes
        w.close()
        await w.wait_closed()
        finished += 1

    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    links = [await _open(port) for _ in range(n)]
    r = Reactor.for_loop(asyncio.get_running_loop())
    assert len(r) == n
    got: dict[int, bytes] = {}
    pass_of: list[int] = []
    try:
        for i, t in enumerate(links):
            def sink(data: bytes, i: int = i) -> None:
                got[i] = got.get(i, b"") + data
                pass_of.append(r.passes)
            t.start_reading(sink)
        # Every peer answers at once: then all 20 sockets are ready together.
        for i, t in enumerate(links):
            await t.send(f"{i:03d}".encode())
        with anyio.fail_after(5):
            while len(got) < n or any(len(v) < 9 for v in got.values()):  # bounded by fail_after
                await anyio.sleep(0.01)
    finally:
        for t in links:
            await t.aclose()
        with anyio.fail_after(5):
            while finished < n:  # each peer saw its link close; bounded by fail_after
                await anyio.sleep(0.01)
        server.close()
        await server.wait_closed()
    assert got == {i: f"hello-{i:03d}".encode() for i in range(n)}
    assert max(Counter(pass_of).values()) <= 4  # never more reads in one pass than the slice
    assert len(r) == 0 and id(asyncio.get_running_loop()) not in Reactor._by_loop  # closed with its last link


async def test_eof_ends_the_link_and_a_failing_sink_hurts_no_other_link() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.readexactly(1)
        w.write(b"data")
        await w.drain()
        w.close()

    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    bad, good = await _open(port), await _open(port)
    received: list[bytes] = []

    def failing(data: bytes) -> None:
        raise RuntimeError("a broken sink")

    try:
        bad.start_reading(failing)
        good.start_reading(received.append)
        await bad.send(b"x")
        await good.send(b"x")
        with anyio.fail_after(5):
            with pytest.raises(LinkError, match="closed"):
                await good.wait_closed()  # the peer closed after its data
            with pytest.raises(LinkError, match="closed"):
                await bad.wait_closed()
        assert b"".join(received) == b"data"
        with pytest.raises(LinkError, match="closed"):
            await good.send(b"more")
    finally:
        await bad.aclose()
        await good.aclose()
        server.close()
        await server.wait_closed()


async def test_send_waits_while_the_peer_does_not_read_and_nothing_is_lost() -> None:
    reading = asyncio.Event()
    total = 0

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        nonlocal total
        await reading.wait()
        while chunk := await r.read(1 << 20):
            total += len(chunk)
        w.close()

    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    t = await _open(port)
    chunk = b"m" * (256 * 1024)
    sent = 0
    blocked = False
    try:
        for _ in range(400):  # 100 MiB at most: loopback buffers fill long before
            try:
                with anyio.fail_after(0.5):
                    await t.send(chunk)
            except TimeoutError:
                blocked = True  # waiting on the write buffer's high water: the peer does not read
                break
            sent += len(chunk)
        assert blocked
        # The interrupted send's bytes were buffered before it waited: they count as sent.
        sent += len(chunk)
        reading.set()
        await t.send(b"end")
        sent += 3
        await t.aclose()  # flushes what waits, then closes
        with anyio.fail_after(10):
            while total < sent:  # bounded by fail_after
                await anyio.sleep(0.01)
        assert total == sent
    finally:
        reading.set()
        server.close()
        await server.wait_closed()
