"""TCP links read through the loop's one epoll (drivers/mavlink/reactor.py), against real loopback sockets."""

from __future__ import annotations

import asyncio
import socket
import time
from collections import Counter

import anyio
import pytest

from mavjet.contract.errors import LinkError
from mavjet.drivers.mavlink import reactor
from mavjet.drivers.mavlink.reactor import Reactor, ReactorTransport
from mavjet.drivers.mavlink.transport import Endpoint, Inbox, open_transport

pytestmark = pytest.mark.skipif(not reactor.AVAILABLE, reason="epoll is Linux only")


async def _open(port: int) -> ReactorTransport:
    t = await open_transport(Endpoint.parse(f"tcp:127.0.0.1:{port}"), connect_timeout_s=2)
    assert isinstance(t, ReactorTransport)
    return t


async def _read_all(pairs: list[tuple[socket.socket, socket.socket]], *,
                    urgent: bool = False) -> tuple[dict[int, bytes], list[int], Reactor]:
    """Attach one end of each pair, make every link ready at once, read them; (bytes per link, pass per read)."""
    loop = asyncio.get_running_loop()
    r = Reactor.for_loop(loop)
    assert not r.urgent  # a new reactor is not urgent until told
    reactor.set_urgent(loop, urgent)
    links = [ReactorTransport(Endpoint.parse(f"tcp:127.0.0.1:{i + 1}"), a, r, Inbox()) for i, (a, _) in enumerate(pairs)]
    got: dict[int, bytes] = {}
    pass_of: list[int] = []
    try:
        for i, t in enumerate(links):
            def sink(data: bytes, i: int = i) -> None:
                got[i] = got.get(i, b"") + data
                pass_of.append(r.passes)
            t.start_reading(sink)
        for i, (_, b) in enumerate(pairs):
            b.send(f"hello-{i:03d}".encode())
        time.sleep(0.05)  # noqa: ASYNC251 (on purpose: the loop is busy elsewhere, every link gets ready)
        with anyio.fail_after(5):
            while len(got) < len(pairs):  # bounded by fail_after
                await anyio.sleep(0.005)
    finally:
        for t in links:
            await t.aclose()
        for _, b in pairs:
            b.close()
    return got, pass_of, r


async def test_a_pass_reads_a_slice_when_the_loop_was_busy_for_less(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reactor, "MAX_READS_PER_PASS", 4)
    monkeypatch.setattr(reactor, "MAX_SLICE_S", 0.0)  # never more than one slice a pass
    pairs = [socket.socketpair() for _ in range(20)]
    got, pass_of, r = await _read_all(pairs)
    assert got == {i: f"hello-{i:03d}".encode() for i in range(20)}  # each link's bytes in its own sink
    assert max(Counter(pass_of).values()) == 4  # a slice a pass, the rest left ready for the next
    assert r.ready_seen == 20 and r.passes >= 5  # every ready socket counted once (mavjet bench ingest reports both)
    assert len(r) == 0 and id(asyncio.get_running_loop()) not in Reactor._by_loop  # closed with its last link


async def test_while_something_urgent_waits_a_pass_reads_only_the_urgent_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    # As the test below, where the loop was away 50 ms and one pass read all 20; urgent, it may not.
    monkeypatch.setattr(reactor, "MAX_READS_PER_PASS", 4)
    monkeypatch.setattr(reactor, "URGENT_SLICE_S", 0.0)  # one slice a pass while urgent
    loop = asyncio.get_running_loop()
    reactor.set_urgent(loop, True)  # no reactor yet: nothing to tell, and none is made
    assert Reactor.existing(loop) is None
    pairs = [socket.socketpair() for _ in range(20)]
    got, pass_of, r = await _read_all(pairs, urgent=True)
    assert len(got) == 20 and r.urgent
    assert max(Counter(pass_of).values()) == 4 and len(Counter(pass_of)) >= 5
    assert Reactor.existing(loop) is None  # gone with its last link, and its urgency with it


async def test_a_pass_reads_as_long_as_the_rest_of_the_loop_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reactor, "MAX_READS_PER_PASS", 4)
    pairs = [socket.socketpair() for _ in range(20)]
    got, pass_of, _ = await _read_all(pairs)
    assert len(got) == 20
    # The loop was away 50 ms: the reactor's turn may read that long, slice after slice, so all 20 in one pass.
    assert len(Counter(pass_of)) == 1


async def test_the_read_share_climbs_while_passes_leave_sockets_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reactor, "MAX_READS_PER_PASS", 4)
    monkeypatch.setattr(reactor, "MAX_SLICE_S", 0.0)  # one slice a pass: ten passes end with links still ready
    monkeypatch.setattr(reactor, "MAX_READ_SHARE", 1.3)
    pairs = [socket.socketpair() for _ in range(40)]
    got, pass_of, r = await _read_all(pairs)
    assert len(got) == 40 and len(Counter(pass_of)) == 10
    assert r.share == pytest.approx(1.3)  # 1.05 ** 10 would be 1.63: the cap holds


async def test_the_read_share_decays_to_even_while_every_pass_drains() -> None:
    a, b = socket.socketpair()
    r = Reactor.for_loop(asyncio.get_running_loop())
    link = ReactorTransport(Endpoint.parse("tcp:127.0.0.1:1"), a, r, Inbox())
    got: list[bytes] = []
    link.start_reading(got.append)
    r.share = 2.0  # as after an overload
    try:
        for i in range(15):  # one link, one message a pass: every pass drains
            b.send(b"x")
            with anyio.fail_after(5):
                while len(got) <= i:  # bounded by fail_after
                    await anyio.sleep(0.001)
        # At least 15 drained passes (a spurious wake-up that finds nothing drains too), never below even.
        assert reactor.MIN_READ_SHARE <= r.share <= 2.0 * reactor.SHARE_DOWN**15 + 1e-9
        for _ in range(60):
            b.send(b"x")
            await anyio.sleep(0.001)
        with anyio.fail_after(5):
            while sum(map(len, got)) < 75:  # bounded by fail_after
                await anyio.sleep(0.001)
        assert r.share == reactor.MIN_READ_SHARE  # 2.0 * 0.97 ** 75 is below it: the floor holds
    finally:
        await link.aclose()
        b.close()


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
