"""One epoll for the fleet's TCP links: one event-loop callback reads the sockets that are ready, a slice per pass.

asyncio's selector loop gives every ready socket a handle of its own and reads
all of them in one pass of the loop. At 2,000 vehicles a pass read 500 to 1,200
sockets and held the loop 45 to 170 ms (a hook in `mavjet bench ingest`); the
state tick and the NATS acks waited behind it, which was most of a state
sample's p99. Here the event loop watches one descriptor, this epoll's, and
its callback reads the ready sockets in slices of `MAX_READS_PER_PASS`,
and stops after a slice once it has read for `share` times as long as the
rest of the loop ran since its last turn (at most `MAX_SLICE_S`). The
others stay ready (level-triggered; the kernel hands them out in turn) and
are read in the next pass, after whatever else was due. The share is even
(1) while passes read every ready socket, which is how a gateway that keeps
up runs, so a pass stays short and the state tick and the NATS acks wait
little. Each pass that leaves sockets ready raises it by 5 %, up to 3, and
each pass that drains lowers it by 3 %: under overload reading gets up to
three quarters of the loop, so the state tick finds the newest samples
instead of leaving them in the kernel. At twice the knee that stores 94.6 %
of the knee's state rate (an even share: 83 to 88 %; asyncio's transports,
which read every ready socket in one pass: 95 to 97 %, at about twice the
p99); docs/performance.md has the figures. A read costs less too: no
handle, no chain of transport methods, the bytes go straight to the link's
sink (drivers/mavlink/inbound.py `Inbound.on_bytes`).

While something urgent waits on the loop (the gateway sets `set_urgent`
while a command runs, between its delivery and its result), a pass reads
for at most `URGENT_SLICE_S`, whatever the share: each hop of the command
through the loop (its ACK read, its result published, the NATS acks) then
waits for a short pass, not for up to `MAX_SLICE_S` of other vehicles'
telemetry. The state tick shortens its steps the same way (gateway/daemon.py).

Writes go straight to the socket; what it does not take waits in a buffer
for the loop's writer callback, and `send` waits while more than
`WRITE_HIGH_WATER` bytes wait. Linux only (epoll): elsewhere
`open_transport` keeps asyncio's own transport (drivers/mavlink/transport.py).
"""

from __future__ import annotations

import asyncio
import select
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio
import structlog

from mavjet.contract.errors import LinkError
from mavjet.drivers.mavlink.perloop import PerLoop

if TYPE_CHECKING:  # drivers/mavlink/transport.py imports this module
    from mavjet.drivers.mavlink.transport import Endpoint, Inbox

log = structlog.get_logger("mavjet.link")

AVAILABLE = hasattr(select, "epoll")
MAX_READS_PER_PASS = 128  # a slice: ~5 ms at ~40 µs a read (decode, normalise, pack)
MAX_SLICE_S = 0.050  # the longest a pass reads, however long the rest of the loop took
URGENT_SLICE_S = 0.003  # ... while something urgent waits (`set_urgent`); the state tick's step then too
# The read share: a pass reads for up to `share` times as long as the rest of the loop ran.
# It rises while passes end with sockets still ready and decays while they drain (see _read_ready).
MIN_READ_SHARE = 1.0
MAX_READ_SHARE = 3.0
SHARE_UP = 1.05  # per pass that ends with sockets still ready
SHARE_DOWN = 0.97  # per pass that read every ready socket
WRITE_HIGH_WATER = 64 * 1024
READ_SIZE = 65536  # every transport's read (drivers/mavlink/transport.py takes it from here); a vehicle's is a few hundred bytes


class Reactor(PerLoop):
    """The loop's epoll of TCP links. One per event loop (`for_loop`), closed with its last link."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self._ep = select.epoll()
        self._links: dict[int, ReactorTransport] = {}
        self.passes = 0  # callbacks run, for tests and diagnosis
        self.ready_seen = 0  # ready sockets the passes were handed (reads tried), for diagnosis
        self._slice_end = time.perf_counter()  # when the last callback ended
        self.share = MIN_READ_SHARE  # how long a pass may read, in units of the rest of the loop's time
        self.urgent = False  # something urgent waits on the loop: passes of at most URGENT_SLICE_S
        loop.add_reader(self._ep.fileno(), self._read_ready)

    def __len__(self) -> int:
        return len(self._links)

    def attach(self, link: ReactorTransport) -> None:
        self._ep.register(link.fd, select.EPOLLIN)
        self._links[link.fd] = link

    def detach(self, link: ReactorTransport) -> None:
        if self._links.pop(link.fd, None) is None:
            return
        try:
            self._ep.unregister(link.fd)
        except OSError:
            pass  # closed already: the kernel dropped it from the epoll
        if not self._links:
            self._loop.remove_reader(self._ep.fileno())
            self._ep.close()
            self.forget()

    def _read_ready(self) -> None:
        # Per read at thousands of vehicles: locals, and nothing that is not needed.
        self.passes += 1
        now = time.perf_counter()
        deadline = now + min(URGENT_SLICE_S if self.urgent else MAX_SLICE_S, (now - self._slice_end) * self.share)
        links = self._links
        ep = self._ep
        drained = False
        while True:
            try:
                events = ep.poll(0, MAX_READS_PER_PASS)
            except (InterruptedError, ValueError):  # ValueError: closed with the last link in this pass
                break
            self.ready_seen += len(events)
            for fd, _ in events:
                link = links.get(fd)
                if link is None:
                    continue
                try:
                    data = link.sock_recv(READ_SIZE)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError as exc:
                    link.lost(f"read failed: {exc.strerror or exc}")
                    continue
                if not data:
                    link.lost("connection closed")
                    continue
                try:
                    link.deliver(data)
                except Exception:  # the link's sink catches its own; this keeps one vehicle from stopping the rest
                    log.exception("link_sink_failed", endpoint=str(link.endpoint))
            if len(events) < MAX_READS_PER_PASS:
                drained = True
                break
            if time.perf_counter() >= deadline:
                break
        # Multiplicative both ways: at equilibrium about two passes in five end with
        # sockets still ready (ln 1/0.97 : ln 1.05). A fleet the loop keeps up with drains
        # nearly every pass and stays at an even share; under overload the share climbs and
        # reading, which is what lets the state tick keep the newest sample, gets more of the loop.
        if drained:
            self.share = max(MIN_READ_SHARE, self.share * SHARE_DOWN)
        else:
            self.share = min(MAX_READ_SHARE, self.share * SHARE_UP)
        self._slice_end = time.perf_counter()


def set_urgent(loop: asyncio.AbstractEventLoop, urgent: bool) -> None:
    """Say whether something urgent waits on `loop` (see the module docstring). A no-op while the
    loop has no reactor; one made later starts not urgent, until the next call."""
    reactor = Reactor.existing(loop)
    if reactor is not None:
        reactor.urgent = urgent


class ReactorTransport:
    """A TCP link read by the loop's `Reactor`. `start_reading(sink)` is push mode, the fast path the link uses."""

    def __init__(self, endpoint: Endpoint, sock: socket.socket, reactor: Reactor, inbox: Inbox) -> None:
        self.endpoint = endpoint
        self._sock = sock
        self.fd = sock.fileno()
        self.sock_recv = sock.recv
        self._reactor = reactor
        self._loop = reactor.loop
        self._inbox = inbox
        self.deliver: Callable[[bytes], None] = self._inbox.deliver
        self._wbuf = bytearray()  # not empty: the loop's writer callback is registered
        self._below_high_water = asyncio.Event()
        self._below_high_water.set()
        self._flushed = asyncio.Event()  # nothing waits in the write buffer
        self._flushed.set()
        self._lost_reason: str | None = None
        reactor.attach(self)

    # -- reading -------------------------------------------------------------
    def start_reading(self, sink: Callable[[bytes], None]) -> None:
        self._inbox.start_reading(sink)  # hands over what arrived before
        self.deliver = sink

    async def recv(self) -> bytes:
        return await self._inbox.recv(str(self.endpoint))

    async def wait_closed(self) -> None:
        """Wait until the peer closes the connection (or it fails), then raise LinkError."""
        await self._inbox.wait_closed(str(self.endpoint))

    def lost(self, reason: str) -> None:
        """The connection ended (EOF, a read or write error): no more reads, waiters wake."""
        if self._lost_reason is not None:
            return
        self._lost_reason = reason
        self._stop_io()
        self._inbox.close()
        self._below_high_water.set()
        self._flushed.set()

    # -- writing -------------------------------------------------------------
    async def send(self, data: bytes) -> None:
        if self._lost_reason is not None:
            raise LinkError(str(self.endpoint), "connection is closed")
        self._write(data)
        if len(self._wbuf) > WRITE_HIGH_WATER:
            self._below_high_water.clear()
            await self._below_high_water.wait()
        if self._lost_reason is not None:
            raise LinkError(str(self.endpoint), self._lost_reason)

    def send_nowait(self, data: bytes) -> bool:
        """Send without waiting (a link's heartbeat, drivers/mavlink/chores.py).

        False, and nothing sent, when the link is closed or more than
        `WRITE_HIGH_WATER` bytes already wait for a peer that does not read.
        """
        if self._lost_reason is not None or len(self._wbuf) > WRITE_HIGH_WATER:
            return False
        self._write(data)
        return self._lost_reason is None

    def _write(self, data: bytes) -> None:
        if self._wbuf:
            self._wbuf += data
            return
        try:
            n = self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError as exc:
            self.lost(f"write failed: {exc.strerror or exc}")
            return
        if n < len(data):
            self._wbuf += memoryview(data)[n:]
            self._flushed.clear()
            self._loop.add_writer(self.fd, self._write_ready)

    def _write_ready(self) -> None:
        try:
            n = self._sock.send(self._wbuf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.lost(f"write failed: {exc.strerror or exc}")
            return
        del self._wbuf[:n]
        if not self._wbuf:
            self._loop.remove_writer(self.fd)
            self._flushed.set()
        if len(self._wbuf) <= WRITE_HIGH_WATER:
            self._below_high_water.set()

    # -- closing -------------------------------------------------------------
    def _stop_io(self) -> None:
        if self._wbuf:
            self._loop.remove_writer(self.fd)
        self._reactor.detach(self)

    async def aclose(self) -> None:
        if self._wbuf and self._lost_reason is None:
            # What was sent is not dropped at a close: a moment for the socket to take it.
            with anyio.move_on_after(2.0):
                await self._flushed.wait()
        if self._lost_reason is None:
            self._lost_reason = "closed"
            self._stop_io()
        self._inbox.close()
        self._below_high_water.set()
        self._sock.close()
