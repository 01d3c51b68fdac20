"""Async byte transports to autopilots: tcp, udp (listen), udpout, serial.

Transports only move bytes; framing is the codec's job. TCP links are read
through the event loop's one epoll (drivers/mavlink/reactor.py) where there is
one, else through asyncio's transport (`TcpTransport`). Each `recv()` returns
everything that is ready (a TCP read of up to 64 KiB, or every queued UDP
datagram drained until EAGAIN) because event-loop wake-ups, not bytes, are
what limit a Python gateway: reading one datagram per wake-up collapses at
about 13k msgs/s.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import anyio

from mavjet.contract.errors import ConfigError, LinkError
from mavjet.drivers.mavlink import reactor

READ_SIZE = reactor.READ_SIZE  # 64 KiB
MAX_DRAIN_DATAGRAMS = 256


@dataclass(frozen=True, slots=True, kw_only=True)
class Endpoint:
    """Where an autopilot is: `tcp:HOST:PORT`, `udp:HOST:PORT`, `udpout:HOST:PORT`, `serial:DEV:BAUD`."""

    scheme: str
    host: str = ""
    port: int = 0
    device: str = ""
    baud: int = 0

    @classmethod
    def parse(cls, text: str) -> Endpoint:
        scheme, _, rest = text.partition(":")
        scheme = scheme.lower()
        if scheme in ("tcp", "udp", "udpin", "udpout"):
            host, _, port_s = rest.rpartition(":")
            if not host or not port_s.isdigit() or not 0 < int(port_s) < 65536:
                raise ConfigError("endpoint", f"{text!r}: expected {scheme}:HOST:PORT")
            return cls(scheme="udp" if scheme == "udpin" else scheme, host=host, port=int(port_s))
        if scheme == "serial":
            dev, _, baud_s = rest.rpartition(":")
            if not dev or not baud_s.isdigit():
                raise ConfigError("endpoint", f"{text!r}: expected serial:/dev/ttyX:BAUD")
            return cls(scheme=scheme, device=dev, baud=int(baud_s))
        raise ConfigError("endpoint", f"{text!r}: scheme must be tcp, udp, udpout or serial")

    def __str__(self) -> str:
        if self.scheme == "serial":
            return f"serial:{self.device}:{self.baud}"
        return f"{self.scheme}:{self.host}:{self.port}"


class Transport(Protocol):
    endpoint: Endpoint

    async def recv(self) -> bytes:
        """Wait for bytes; return all that are ready. Raises LinkError when closed."""

    async def send(self, data: bytes) -> None:
        """Send bytes; raises LinkError when the link is down."""

    async def aclose(self) -> None: ...


class Inbox:
    """Bytes arriving in a callback, handed to a sink (push mode) or queued for `recv()`.

    Shared by the TCP protocol and the UDP hub's per-vehicle ports: until the
    link calls `start_reading`, bytes wait here; after it, they go straight
    from the event loop's callback into the codec.
    """

    def __init__(self) -> None:
        self.sink: Callable[[bytes], None] | None = None
        self.queue: list[bytes] = []
        self.readable = asyncio.Event()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def deliver(self, data: bytes) -> None:
        sink = self.sink
        if sink is not None:
            sink(data)
        else:
            self.queue.append(data)
            self.readable.set()

    def start_reading(self, sink: Callable[[bytes], None]) -> None:
        for chunk in self.queue:
            sink(chunk)
        self.queue.clear()
        self.sink = sink

    def close(self) -> None:
        self.sink = None
        if not self.closed.done():
            self.closed.set_result(None)
        self.readable.set()

    async def recv(self, where: str) -> bytes:
        while not self.queue:
            if self.closed.done():
                raise LinkError(where, "connection closed")
            self.readable.clear()
            await self.readable.wait()
        data = b"".join(self.queue)
        self.queue.clear()
        return data

    async def wait_closed(self, where: str) -> None:
        """Wait until closed, then raise LinkError."""
        await asyncio.shield(self.closed)
        raise LinkError(where, "connection closed")


class _TcpProtocol(asyncio.Protocol):
    """Delivers bytes from the selector callback itself: no task wake-up per read."""

    def __init__(self) -> None:
        self.inbox = Inbox()
        self.can_write = asyncio.Event()
        self.can_write.set()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.inbox.deliver(data)

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.inbox.close()
        self.can_write.set()

    def pause_writing(self) -> None:
        self.can_write.clear()

    def resume_writing(self) -> None:
        self.can_write.set()


class TcpTransport:
    """TCP client. `start_reading(sink)` switches to push mode, the fast path the link uses."""

    def __init__(self, endpoint: Endpoint, transport: asyncio.Transport, protocol: _TcpProtocol) -> None:
        self.endpoint = endpoint
        self._transport = transport
        self._protocol = protocol
        self._inbox = protocol.inbox

    def start_reading(self, sink: Callable[[bytes], None]) -> None:
        self._inbox.start_reading(sink)
        # From now on the event loop calls the sink itself: two Python calls
        # less per read (the loop looks the method up on the protocol object).
        self._protocol.data_received = sink  # type: ignore[method-assign,assignment]
        # uvloop keeps the bound method it found at connect (asyncio looks it up per read):
        # handing it the protocol again makes it look again. ~1.5 % of the gateway's CPU.
        self._transport.set_protocol(self._protocol)

    async def wait_closed(self) -> None:
        """Wait until the peer closes the connection, then raise LinkError."""
        await self._inbox.wait_closed(str(self.endpoint))

    async def recv(self) -> bytes:
        return await self._inbox.recv(str(self.endpoint))

    async def send(self, data: bytes) -> None:
        if self._transport.is_closing() or self._inbox.closed.done():
            raise LinkError(str(self.endpoint), "connection is closed")
        try:
            self._transport.write(data)
        except OSError as exc:
            raise LinkError(str(self.endpoint), f"write failed: {exc}") from exc
        if not self._protocol.can_write.is_set():
            await self._protocol.can_write.wait()

    async def aclose(self) -> None:
        self._transport.close()
        if not self._inbox.closed.done():
            with anyio.move_on_after(2.0) as scope:
                await asyncio.shield(self._inbox.closed)
            if scope.cancelled_caught:
                self._transport.abort()


class UdpTransport:
    """`udp:` binds and learns the peer from the first datagram; `udpout:` sends to a fixed peer."""

    def __init__(self, endpoint: Endpoint, sock: socket.socket, peer: tuple[str, int] | None) -> None:
        self.endpoint = endpoint
        self._sock = sock
        self._peer = peer
        self._fixed_peer = peer is not None
        self._loop = asyncio.get_running_loop()

    async def recv(self) -> bytes:
        try:
            first, addr = await self._loop.sock_recvfrom(self._sock, READ_SIZE)
        except OSError as exc:
            raise LinkError(str(self.endpoint), f"recv failed: {exc}") from exc
        if not self._fixed_peer:
            self._peer = addr
        chunks = [first]
        # Drain what else is queued in the same wake-up.
        for _ in range(MAX_DRAIN_DATAGRAMS):
            try:
                data, addr = self._sock.recvfrom(READ_SIZE)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            chunks.append(data)
        return b"".join(chunks) if len(chunks) > 1 else first

    async def send(self, data: bytes) -> None:
        if self._peer is None:
            return  # nobody has spoken to us yet: nowhere to send
        try:
            await self._loop.sock_sendto(self._sock, data, self._peer)
        except OSError as exc:
            raise LinkError(str(self.endpoint), f"send failed: {exc}") from exc

    async def aclose(self) -> None:
        self._sock.close()


class SerialTransport:
    """A serial port read through the event loop's selector, never a blocking read."""

    def __init__(self, endpoint: Endpoint, port: object, fd: int) -> None:
        self.endpoint = endpoint
        self._port = port
        self._fd = fd
        self._loop = asyncio.get_running_loop()

    async def _wait(self, add: str, remove: str) -> None:
        fut: asyncio.Future[None] = self._loop.create_future()

        def ready() -> None:
            if not fut.done():
                fut.set_result(None)

        getattr(self._loop, add)(self._fd, ready)
        try:
            await fut
        finally:
            getattr(self._loop, remove)(self._fd)

    async def recv(self) -> bytes:
        while True:
            try:
                data = os.read(self._fd, READ_SIZE)
            except (BlockingIOError, InterruptedError):
                await self._wait("add_reader", "remove_reader")
                continue
            except OSError as exc:
                raise LinkError(str(self.endpoint), f"read failed: {exc}") from exc
            if not data:
                raise LinkError(str(self.endpoint), "device closed")
            return data

    async def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self._fd, view)
            except (BlockingIOError, InterruptedError):
                await self._wait("add_writer", "remove_writer")
                continue
            except OSError as exc:
                raise LinkError(str(self.endpoint), f"write failed: {exc}") from exc
            view = view[n:]

    async def aclose(self) -> None:
        close = getattr(self._port, "close", None)
        if close is not None:
            close()


def limit_read_size(transport: object) -> None:
    """Make asyncio's socket transport read at most READ_SIZE bytes at a time.

    Its default (`max_size`, 256 KiB) is allocated for every `recv` and
    shrunk to what arrived; an allocation that large is a fresh mmap each
    time, ~14 µs a read on these machines against ~0.3 µs for 64 KiB
    (docs/performance.md). A vehicle's read is a few hundred bytes. uvloop's
    transports have no such attribute and read into their own buffer.
    """
    if hasattr(transport, "max_size"):
        transport.max_size = READ_SIZE


# Read TCP links through the loop's one epoll (drivers/mavlink/reactor.py) where there is one.
USE_REACTOR = True


async def _open_reactor_tcp(endpoint: Endpoint) -> reactor.ReactorTransport:
    """Connect to every address of the host in turn; attach the socket to the loop's reactor.

    Raises OSError as `loop.create_connection` does; the caller bounds the time.
    """
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(endpoint.host, endpoint.port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    error = OSError(f"no address for {endpoint.host}")
    for family, kind, proto, _, addr in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, addr)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        except BaseException:  # cancelled (the caller's timeout): no socket left behind
            sock.close()
            raise
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return reactor.ReactorTransport(endpoint, sock, reactor.Reactor.for_loop(loop), Inbox())
    raise error


async def open_transport(endpoint: Endpoint, *, connect_timeout_s: float) -> Transport:
    """Open a transport, translating OS errors into LinkError."""
    where = str(endpoint)
    try:
        if endpoint.scheme == "tcp" and reactor.AVAILABLE and USE_REACTOR:
            with anyio.fail_after(connect_timeout_s):
                return await _open_reactor_tcp(endpoint)
        if endpoint.scheme == "tcp":
            loop = asyncio.get_running_loop()
            with anyio.fail_after(connect_timeout_s):
                tr, proto = await loop.create_connection(_TcpProtocol, endpoint.host, endpoint.port)
            sock = tr.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            limit_read_size(tr)
            return TcpTransport(endpoint, tr, proto)
        if endpoint.scheme in ("udp", "udpout"):
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.setblocking(False)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
            if endpoint.scheme == "udp":
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((endpoint.host, endpoint.port))
                return UdpTransport(endpoint, sock, None)
            return UdpTransport(endpoint, sock, (endpoint.host, endpoint.port))
        if endpoint.scheme == "serial":
            import serial  # pyserial: configures baud/termios; we do the I/O ourselves

            port = serial.Serial(endpoint.device, endpoint.baud, timeout=0, write_timeout=0, exclusive=True)
            return SerialTransport(endpoint, port, port.fileno())
    except TimeoutError as exc:
        raise LinkError(where, f"no connection within {connect_timeout_s}s") from exc
    except OSError as exc:
        raise LinkError(where, f"cannot open: {exc.strerror or exc}") from exc
    except Exception as exc:  # serial.SerialException and friends
        if type(exc).__name__ == "SerialException":
            raise LinkError(where, f"cannot open: {exc}") from exc
        raise
    raise LinkError(where, f"unsupported scheme {endpoint.scheme!r}")
