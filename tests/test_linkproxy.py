"""The throttling proxy measured against a loopback echo: rate, delay and outages, with loose bounds.

Bounds come from the profile: bytes / rate and the round trip are lower
bounds the proxy must respect (a token bucket of one MTU lets at most one
packet through early); upper bounds are generous, since the machine is shared.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from mavjet.benchmarks.linkproxy import LinkProfile, LinkProxy, Outage, OutageKind


@pytest.fixture
async def echo_port() -> AsyncIterator[int]:
    async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        except OSError:
            pass
        finally:
            w.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    yield int(server.sockets[0].getsockname()[1])
    server.close()


async def _roundtrip(r: asyncio.StreamReader, w: asyncio.StreamWriter, payload: bytes) -> float:
    t0 = time.monotonic()
    w.write(payload)
    await w.drain()
    await asyncio.wait_for(r.readexactly(len(payload)), 30.0)
    return time.monotonic() - t0


async def test_rate_each_way_is_bounded_by_the_profile(echo_port: int) -> None:
    profile = LinkProfile(rate_bps=128_000, delay_s=0.0)  # 16 kB/s each way
    size = 24_000
    async with LinkProxy(echo_port, profile) as proxy:
        r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
        elapsed = await _roundtrip(r, w, b"x" * size)
        w.close()
    ideal_s = size / profile.bytes_per_s  # both directions pipeline: one serialisation time, plus a packet
    assert elapsed >= ideal_s * 0.8, f"{size} B took {elapsed:.2f} s, faster than {profile.rate_bps} bit/s"
    assert elapsed < ideal_s * 4 + 2.0
    assert proxy.up.bytes == size and proxy.down.bytes == size


async def test_one_way_delay_makes_the_round_trip(echo_port: int) -> None:
    profile = LinkProfile(rate_bps=0, delay_s=0.1)
    async with LinkProxy(echo_port, profile) as proxy:
        r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
        rtts = [await _roundtrip(r, w, b"ping") for _ in range(3)]
        w.close()
    assert min(rtts) >= 2 * profile.delay_s * 0.95
    assert max(rtts) < 2 * profile.delay_s + 1.5


async def test_a_cut_closes_connections_and_refuses_new_ones_until_it_ends(echo_port: int) -> None:
    async with LinkProxy(echo_port, LinkProfile(rate_bps=0, delay_s=0.0)) as proxy:
        r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
        await _roundtrip(r, w, b"before")
        proxy.outage(0.6, OutageKind.CUT)
        assert await asyncio.wait_for(r.read(10), 5.0) == b""  # the open connection was closed
        r2, w2 = await asyncio.open_connection("127.0.0.1", proxy.port)
        assert await asyncio.wait_for(r2.read(10), 5.0) == b""  # refused: accepted and closed at once
        assert proxy.refused == 1
        for _ in range(50):  # bounded: the cut ends after 0.6 s
            if not proxy.in_outage:
                break
            await asyncio.sleep(0.05)
        r3, w3 = await asyncio.open_connection("127.0.0.1", proxy.port)
        assert await _roundtrip(r3, w3, b"after") >= 0
        for wr in (w, w2, w3):
            wr.close()


async def test_a_hold_delivers_what_was_sent_after_it_ends(echo_port: int) -> None:
    profile = LinkProfile(rate_bps=0, delay_s=0.0, outages=(Outage(at_s=0.0, duration_s=0.5, kind=OutageKind.HOLD),))
    async with LinkProxy(echo_port, profile) as proxy:
        await asyncio.sleep(0.05)  # the scheduled hold has begun
        assert proxy.in_outage
        r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
        elapsed = await _roundtrip(r, w, b"held")  # nothing lost, only late
        w.close()
    assert elapsed >= 0.3
    assert proxy.connections == 1 and proxy.refused == 0


async def test_close_ends_every_connection_quietly(echo_port: int) -> None:
    # A connection mid-hold (its bytes waiting for the hold to end) when the proxy closes: close()
    # returns with no connection handler left running, and none ends as an error the loop logs
    # (Python 3.11's start_server logs a handler task that ends cancelled).
    loop = asyncio.get_running_loop()
    logged: list[dict[str, object]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, ctx: logged.append(ctx))
    try:
        proxy = LinkProxy(echo_port, LinkProfile(rate_bps=0, delay_s=0.05))
        await proxy.start()
        r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
        await _roundtrip(r, w, b"x" * 100)
        proxy.outage(30.0, OutageKind.HOLD)
        w.write(b"y" * 100)
        await w.drain()
        await asyncio.sleep(0.1)
        await asyncio.wait_for(proxy.close(), 10.0)
        handlers = [t for t in asyncio.all_tasks() if "_accept" in repr(t.get_coro())]
        assert handlers == [], handlers
        for _ in range(5):  # a few loop passes for any done-callback to run
            await asyncio.sleep(0)
        w.close()
    finally:
        loop.set_exception_handler(previous)
    assert logged == [], logged
