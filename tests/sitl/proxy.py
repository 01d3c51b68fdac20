"""A relay between the gateway and a vehicle that can lose the link on cue, for the simulator and SITL alike: TCP
for `tcp:` vehicles, UDP for `udpout:` ones (PX4 SITL, which answers the relay's socket as its ground station).

`cut_after(msgid, nth, seconds)`: once the `nth` MAVLink 2 frame with `msgid` has gone from the gateway
to the vehicle, everything in both directions is dropped for `seconds` (the connections stay open,
as when a radio goes out of range), so the link is lost in the middle of whatever command sent it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

STX2 = 0xFD


@dataclass
class _Cue:
    msgid: int
    nth: int
    seconds: float
    seen: int = 0


@dataclass
class LinkCutter:
    upstream: str  # tcp:HOST:PORT or udpout:HOST:PORT of the vehicle
    endpoint: str = ""  # tcp:127.0.0.1:PORT (udpout:127.0.0.1:PORT) for the gateway, once started
    cut_until: float = 0.0  # monotonic
    cuts: int = 0
    _cue: _Cue | None = None
    _buf: bytearray = field(default_factory=bytearray)
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _udp: list[asyncio.DatagramTransport] = field(default_factory=list)

    @property
    def cut(self) -> bool:
        return time.monotonic() < self.cut_until

    def cut_after(self, msgid: int, nth: int, seconds: float) -> None:
        self._cue = _Cue(msgid=msgid, nth=nth, seconds=seconds)

    async def __aenter__(self) -> LinkCutter:
        if self.upstream.startswith("udpout:"):
            await self._start_udp()
            return self
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.endpoint = f"tcp:127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def _start_udp(self) -> None:
        """One loopback socket faces the gateway (it sends first), one the vehicle; datagrams cross unless cut."""
        loop = asyncio.get_running_loop()
        _, host, port = self.upstream.split(":")
        gateway_addr: list[tuple[str, int]] = []

        def to_gateway(data: bytes, addr: tuple[str, int]) -> None:
            if gateway_addr and not self.cut:
                gw.sendto(data, gateway_addr[0])

        def to_vehicle(data: bytes, addr: tuple[str, int]) -> None:
            gateway_addr[:] = [addr]
            if not self.cut:
                up.sendto(data)
                if self._cue is not None:
                    self._watch(data)

        gw, _ = await loop.create_datagram_endpoint(lambda: _Datagrams(to_vehicle), local_addr=("127.0.0.1", 0))
        up, _ = await loop.create_datagram_endpoint(lambda: _Datagrams(to_gateway), remote_addr=(host, int(port)))
        self._udp = [gw, up]
        self.endpoint = f"udpout:127.0.0.1:{gw.get_extra_info('sockname')[1]}"

    async def __aexit__(self, *exc: object) -> None:
        for t in self._udp:
            t.close()
        if self._server is None:
            return
        self._server.close()
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _, host, port = self.upstream.split(":")
        try:
            up_r, up_w = await asyncio.open_connection(host, int(port))
        except OSError:
            writer.close()
            return
        self._buf.clear()
        down = asyncio.create_task(self._pump(reader, up_w, to_vehicle=True))
        up = asyncio.create_task(self._pump(up_r, writer, to_vehicle=False))
        self._tasks |= {down, up}
        try:
            await asyncio.wait({down, up}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (down, up):
                t.cancel()
                self._tasks.discard(t)
            for w in (writer, up_w):
                w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, to_vehicle: bool) -> None:
        while data := await reader.read(65536):
            if self.cut:
                continue
            writer.write(data)
            if to_vehicle and self._cue is not None:
                self._watch(data)

    def _watch(self, data: bytes) -> None:
        """Count frames of the cue's msgid in the gateway's byte stream; cut the link after the nth."""
        cue = self._cue
        assert cue is not None
        buf = self._buf
        buf += data
        while True:
            start = buf.find(STX2)
            if start < 0:
                buf.clear()
                return
            del buf[:start]
            if len(buf) < 10:
                return
            size = 12 + buf[1] + (13 if buf[2] & 1 else 0)
            if len(buf) < size:
                return
            msgid = buf[7] | buf[8] << 8 | buf[9] << 16
            del buf[:size]
            if msgid == cue.msgid:
                cue.seen += 1
                if cue.seen == cue.nth:
                    self._cue = None
                    self.cut_until = time.monotonic() + cue.seconds
                    self.cuts += 1
                    buf.clear()
                    return


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, on_datagram: Callable[[bytes, tuple[str, int]], None]) -> None:
        self._on = on_datagram

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self._on(data, addr)

    def error_received(self, exc: Exception) -> None:  # e.g. the vehicle not listening yet: datagrams are lost
        pass
