"""One UDP port shared by many vehicles, demultiplexed by MAVLink system id.

Edge hubs often receive a whole fleet on one port (14550). `UdpHub` owns the
socket, drains it in batches, reads the sender's system id from each
datagram's first frame header (no full parse) and hands the datagram to that
vehicle's `HubPort`, which the vehicle's link uses like any other transport.
Replies go to the address each system id last spoke from. Datagrams from
unknown system ids are counted and dropped.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from dataclasses import dataclass

from mavjet.contract.errors import LinkError
from mavjet.drivers.mavlink.transport import MAX_DRAIN_DATAGRAMS, READ_SIZE, Endpoint, Inbox


def sysid_of(datagram: bytes) -> int | None:
    """System id of the first MAVLink frame in a datagram, from the header alone."""
    if len(datagram) >= 10 and datagram[0] == 0xFD:
        return datagram[5]
    if len(datagram) >= 6 and datagram[0] == 0xFE:
        return datagram[3]
    return None


@dataclass(slots=True)
class HubStats:
    datagrams: int = 0
    unknown_sysid: int = 0
    not_mavlink: int = 0


class HubPort:
    """The per-vehicle face of a UdpHub: a Transport with push-mode reads."""

    def __init__(self, hub: UdpHub, sysid: int) -> None:
        self.endpoint = Endpoint(scheme="udp", host=hub.endpoint.host, port=hub.endpoint.port)
        self._hub = hub
        self._sysid = sysid
        self._inbox = Inbox()
        self.deliver = self._inbox.deliver

    def start_reading(self, sink: Callable[[bytes], None]) -> None:
        self._inbox.start_reading(sink)

    async def wait_closed(self) -> None:
        await self._inbox.wait_closed(f"{self.endpoint} sysid {self._sysid}")

    async def recv(self) -> bytes:
        return await self._inbox.recv(f"{self.endpoint} sysid {self._sysid}")

    async def send(self, data: bytes) -> None:
        await self._hub.send_to(self._sysid, data)

    async def aclose(self) -> None:
        # The socket belongs to the hub; this vehicle just stops listening.
        self._inbox.close()
        self._hub.detach(self._sysid, self)


class UdpHub:
    """Owns one UDP socket; `port_for(sysid)` gives each vehicle its HubPort."""

    def __init__(self, endpoint: Endpoint, *, bound: socket.socket | None = None) -> None:
        # `bound`: a socket already bound to the port (a `--workers` process's share of it,
        # gateway/runtime/workers.py): the hub reads it instead of binding its own.
        self._bound = bound
        if endpoint.scheme != "udp":
            raise ValueError("a shared port is a udp: (listen) endpoint")
        self.endpoint = endpoint
        self.stats = HubStats()
        self._ports: dict[int, HubPort] = {}
        self._peers: dict[int, tuple[str, int]] = {}
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _open(self) -> socket.socket:
        if self._sock is None and self._bound is not None:
            self._bound.setblocking(False)
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(self._bound.fileno(), self._read_ready)
            self._sock = self._bound
        if self._sock is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.setblocking(False)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((self.endpoint.host, self.endpoint.port))
            except OSError as exc:
                sock.close()
                raise LinkError(str(self.endpoint), f"cannot bind: {exc.strerror or exc}") from exc
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(sock.fileno(), self._read_ready)
            self._sock = sock
        return self._sock

    def port_for(self, sysid: int) -> HubPort:
        self._open()
        port = HubPort(self, sysid)
        self._ports[sysid] = port
        return port

    def detach(self, sysid: int, port: HubPort) -> None:
        if self._ports.get(sysid) is port:
            del self._ports[sysid]

    def _read_ready(self) -> None:
        sock = self._sock
        if sock is None:
            return
        # Drain in one wake-up: reading one datagram per wake-up collapses at ~13k msgs/s.
        for _ in range(MAX_DRAIN_DATAGRAMS):
            try:
                data, addr = sock.recvfrom(READ_SIZE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            self.stats.datagrams += 1
            sysid = sysid_of(data)
            if sysid is None:
                self.stats.not_mavlink += 1
                continue
            port = self._ports.get(sysid)
            if port is None:
                self.stats.unknown_sysid += 1
                continue
            self._peers[sysid] = addr
            port.deliver(data)

    async def send_to(self, sysid: int, data: bytes) -> None:
        peer = self._peers.get(sysid)
        sock = self._sock
        if peer is None or sock is None or self._loop is None:
            return  # the vehicle has not spoken yet: nowhere to send
        try:
            await self._loop.sock_sendto(sock, data, peer)
        except OSError as exc:
            raise LinkError(str(self.endpoint), f"send to sysid {sysid} failed: {exc}") from exc

    def close(self) -> None:
        if self._sock is not None:
            if self._loop is not None:
                self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
