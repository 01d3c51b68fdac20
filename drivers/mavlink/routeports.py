"""Route ports: where ground stations connect to the gateway (gateway/routes.py).

A route port listens (udp:, tcp:) or sends (udpout:) raw MAVLink bytes for a
ground station; writes never wait, so a slow station loses frames rather than
holding the vehicle's link. The vehicle-side transports are in transport.py.
"""
from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Protocol

from mavjet.contract.errors import ConfigError, LinkError
from mavjet.drivers.mavlink.transport import Endpoint

# -- route ports: where ground stations connect (gateway/routes.py) ---------------

RouteSink = Callable[[object, bytes], None]  # (peer, bytes): peers are told apart so each stream is framed alone
ROUTE_WRITE_BUFFER_MAX = 256 * 1024  # a TCP client this far behind loses frames instead of growing memory
ROUTE_MAX_UDP_PEERS = 8


class RoutePort(Protocol):
    """A listening or sending endpoint a ground station talks to; writes never wait."""

    endpoint: Endpoint

    def send_nowait(self, data: bytes) -> bool:
        """Send to every peer; False when nothing could be sent (no peer yet, or dropped)."""

    def close(self) -> None: ...


class _UdpRouteProtocol(asyncio.DatagramProtocol):
    def __init__(self, sink: RouteSink, peers: dict[tuple[str, int], None] | None) -> None:
        self.sink = sink
        self.peers = peers  # None: a fixed peer (udpout)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:  # type: ignore[override]
        if self.peers is not None:
            self.peers.pop(addr, None)
            self.peers[addr] = None  # newest last
            while len(self.peers) > ROUTE_MAX_UDP_PEERS:
                del self.peers[next(iter(self.peers))]
        self.sink(addr, data)


class UdpRoutePort:
    """`udp:` listens and answers every peer it heard from (up to 8); `udpout:` sends to one fixed peer."""

    def __init__(self, endpoint: Endpoint, transport: asyncio.DatagramTransport, protocol: _UdpRouteProtocol) -> None:
        self.endpoint = endpoint
        self._transport = transport
        self._protocol = protocol

    def send_nowait(self, data: bytes) -> bool:
        peers = self._protocol.peers
        try:
            if peers is None:
                self._transport.sendto(data)
                return True
            for addr in peers:
                self._transport.sendto(data, addr)
            return bool(peers)
        except OSError:
            return False

    def close(self) -> None:
        self._transport.close()


class _TcpRouteClient(asyncio.Protocol):
    def __init__(self, server: TcpRoutePort) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.clients.add(self)

    def data_received(self, data: bytes) -> None:
        self.server.sink(self, data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.clients.discard(self)


class TcpRoutePort:
    """`tcp:` as a server: every connected client gets every frame."""

    def __init__(self, endpoint: Endpoint, sink: RouteSink) -> None:
        self.endpoint = endpoint
        self.sink = sink
        self.clients: set[_TcpRouteClient] = set()
        self.server: asyncio.Server | None = None

    def send_nowait(self, data: bytes) -> bool:
        sent = False
        for c in list(self.clients):
            t = c.transport
            if t is None or t.is_closing() or t.get_write_buffer_size() > ROUTE_WRITE_BUFFER_MAX:
                continue
            t.write(data)
            sent = True
        return sent

    def close(self) -> None:
        for c in list(self.clients):
            if c.transport is not None:
                c.transport.close()
        if self.server is not None:
            self.server.close()


async def open_route_port(endpoint: Endpoint, sink: RouteSink) -> RoutePort:
    """Open a route endpoint: `udp:` listen, `udpout:` send, `tcp:` server. OS errors become LinkError."""
    loop = asyncio.get_running_loop()
    try:
        if endpoint.scheme in ("udp", "udpout"):
            listen = endpoint.scheme == "udp"
            proto = _UdpRouteProtocol(sink, {} if listen else None)
            addr = {"local_addr": (endpoint.host, endpoint.port)} if listen else {"remote_addr": (endpoint.host, endpoint.port)}
            tr, _ = await loop.create_datagram_endpoint(lambda: proto, **addr)  # type: ignore[arg-type]
            return UdpRoutePort(endpoint, tr, proto)
        if endpoint.scheme == "tcp":
            port = TcpRoutePort(endpoint, sink)
            port.server = await loop.create_server(lambda: _TcpRouteClient(port), endpoint.host, endpoint.port,
                                                   reuse_address=True)
            return port
    except OSError as exc:
        raise LinkError(str(endpoint), f"cannot open route: {exc.strerror or exc}") from exc
    raise ConfigError("route", f"{endpoint}: a route is udp:HOST:PORT (listen), udpout:HOST:PORT or tcp:HOST:PORT (server)")
