"""Transports over real sockets and a real pseudo-terminal."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tty

import pytest

from mavjet.contract.errors import LinkError
from mavjet.drivers.mavlink.codec import MavCodec
from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.drivers.mavlink.transport import Endpoint, UdpTransport, open_transport
from mavjet.ops.natsserver import free_port


def _frames(n: int) -> list[bytes]:
    enc = MavCodec(src_system=1, src_component=1)
    return [enc.encode(mavlink2.MAVLink_attitude_message(i, 0, 0, 0, 0, 0, 0)) for i in range(n)]


async def test_udp_listen_drains_many_datagrams_per_wakeup() -> None:
    port = free_port()
    t = await open_transport(Endpoint.parse(f"udp:127.0.0.1:{port}"), connect_timeout_s=1)
    assert isinstance(t, UdpTransport)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    frames = _frames(50)
    for f in frames:
        tx.sendto(f, ("127.0.0.1", port))
    dec = MavCodec()
    got: list[object] = []
    reads = 0
    async with asyncio.timeout(5):
        while len(got) < 50:
            got += dec.feed(await t.recv())
            reads += 1
    assert len(got) == 50
    assert reads < 50  # datagrams queued together come back in one recv()
    # The peer is learned from the first datagram: replies go back to it.
    await t.send(b"pong")
    tx.settimeout(2)
    assert tx.recvfrom(100)[0] == b"pong"
    tx.close()
    await t.aclose()


async def test_udpout_sends_to_fixed_peer() -> None:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(2)
    port = rx.getsockname()[1]
    t = await open_transport(Endpoint.parse(f"udpout:127.0.0.1:{port}"), connect_timeout_s=1)
    await t.send(b"hello")
    data, addr = rx.recvfrom(100)
    assert data == b"hello"
    rx.sendto(b"back", addr)
    async with asyncio.timeout(2):
        assert await t.recv() == b"back"
    rx.close()
    await t.aclose()


async def test_serial_over_pty_moves_frames_both_ways() -> None:
    master, slave = os.openpty()
    tty.setraw(master)
    os.set_blocking(master, False)
    name = os.ttyname(slave)
    t = await open_transport(Endpoint.parse(f"serial:{name}:57600"), connect_timeout_s=1)
    try:
        frames = b"".join(_frames(5))
        os.write(master, frames)
        dec = MavCodec()
        got: list[object] = []
        async with asyncio.timeout(3):
            while len(got) < 5:
                got += dec.feed(await t.recv())
        assert [m.time_boot_ms for m in got] == [0, 1, 2, 3, 4]
        await t.send(b"\xfd" + b"x" * 20)
        await asyncio.sleep(0.05)
        assert os.read(master, 100).startswith(b"\xfd")
    finally:
        await t.aclose()
        os.close(master)
        os.close(slave)


async def test_missing_serial_device_is_a_link_error() -> None:
    with pytest.raises(LinkError, match="cannot open"):
        await open_transport(Endpoint.parse("serial:/dev/does-not-exist-0:57600"), connect_timeout_s=1)


async def test_tcp_refused_is_a_link_error_and_eof_is_detected() -> None:
    port = free_port()
    with pytest.raises(LinkError, match="cannot open"):
        await open_transport(Endpoint.parse(f"tcp:127.0.0.1:{port}"), connect_timeout_s=1)

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"abc")
        await w.drain()
        w.close()

    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    p = server.sockets[0].getsockname()[1]
    t = await open_transport(Endpoint.parse(f"tcp:127.0.0.1:{p}"), connect_timeout_s=1)
    async with asyncio.timeout(2):
        assert await t.recv() == b"abc"
        with pytest.raises(LinkError, match="closed"):
            await t.recv()
    await t.aclose()
    server.close()
    await server.wait_closed()


UVLOOP_SCRIPT = """
import asyncio, uvloop
from mavjet.drivers.mavlink.codec import MavCodec
from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.drivers.mavlink.transport import Endpoint, Inbox, open_transport

async def main():
    enc = MavCodec(src_system=1, src_component=1)
    data = b"".join(enc.encode(mavlink2.MAVLink_attitude_message(i, 0, 0, 0, 0, 0, 0)) for i in range(3))
    async def handler(r, w):
        await r.readexactly(2)  # the vehicle speaks once the client reads in push mode
        w.write(data)
        await w.drain()
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    t = await open_transport(Endpoint.parse(f"tcp:127.0.0.1:{port}"), connect_timeout_s=2)
    got = []
    t.start_reading(got.append)
    hops = 0
    deliver = Inbox.deliver
    def counting(self, data):
        nonlocal hops
        hops += 1
        deliver(self, data)
    Inbox.deliver = counting
    await t.send(b"go")
    async with asyncio.timeout(3):
        while sum(map(len, got)) < len(data):
            await asyncio.sleep(0.01)
    await t.aclose()
    server.close()
    print(len(MavCodec().feed(b"".join(got))), hops)

uvloop.run(main())
"""


def test_tcp_push_mode_on_uvloop() -> None:
    """Edge hubs run on uvloop (--uvloop): the push-mode TCP transport must work there too.

    And as fast: uvloop calls the sink itself, not the protocol's method that hands bytes on
    (it keeps the bound method it found at connect, so the transport hands it the protocol again).
    """
    out = subprocess.run([sys.executable, "-c", UVLOOP_SCRIPT], capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    frames, hops = out.stdout.split()
    assert (frames, hops) == ("3", "0"), out.stdout
