"""A throttling TCP proxy on loopback: a thin uplink (cellular, satellite) for tests and benchmarks.

Each direction of each connection goes through its own bottleneck: a token
bucket at `rate_bps` bits a second (serialisation), then a fixed one-way
`delay_s` (propagation), in order. The proxy reads from a side only as fast
as its bucket lets bytes out, so a sender that writes faster than the link
queues in its own socket buffers and in its client's write buffer, as it
would behind a modem (bufferbloat included): what a gateway sees of a real
thin link is a slow socket, not an error.

Outages, scheduled (`outages`, seconds after `start()`) or on demand
(`outage()`), come in two kinds: `hold` (a radio fade: nothing moves either
way, connections stay open, what was sent arrives after it) and `cut` (the
link drops: open connections are closed and new ones refused until it ends).

Loopback only, asyncio, no root: `tc netem` needs a network namespace; this
runs anywhere the tests do.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

MTU_BYTES = 1500  # the bucket lets out at most this much at once: a big write is paced like packets


class OutageKind(StrEnum):
    HOLD = "hold"
    CUT = "cut"


@dataclass(frozen=True, slots=True, kw_only=True)
class Outage:
    at_s: float  # after start()
    duration_s: float
    kind: OutageKind = OutageKind.CUT


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkProfile:
    rate_bps: int = 64_000  # each way; 0: unlimited
    delay_s: float = 0.075  # one way: the round trip is twice this
    outages: tuple[Outage, ...] = ()

    def __post_init__(self) -> None:
        if self.rate_bps < 0 or self.delay_s < 0:
            raise ValueError("rate_bps and delay_s must be >= 0")
        for o in self.outages:
            if o.at_s < 0 or o.duration_s <= 0:
                raise ValueError("an outage needs at_s >= 0 and duration_s > 0")

    @property
    def bytes_per_s(self) -> float:
        return self.rate_bps / 8.0


class TokenBucket:
    """Bytes a second with a burst of one MTU; `take` sleeps until the bytes may go."""

    def __init__(self, bytes_per_s: float, burst_bytes: int = MTU_BYTES) -> None:
        self.rate = bytes_per_s
        self.burst = float(burst_bytes)
        self.tokens = self.burst
        self.at = time.monotonic()

    async def take(self, n: int) -> None:
        if self.rate <= 0:
            return
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        self.tokens -= n
        if self.tokens < 0:  # in debt: wait until it is paid
            await asyncio.sleep(-self.tokens / self.rate)


@dataclass(slots=True)
class DirectionStats:
    bytes: int = 0
    chunks: int = 0


class LinkProxy:
    """`async with LinkProxy(target_port, profile) as p:` listens on `p.port` and forwards to the target."""

    def __init__(self, target_port: int, profile: LinkProfile, *, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.profile = profile
        self.port = 0
        self.up = DirectionStats()  # client -> target
        self.down = DirectionStats()  # target -> client
        self.connections = 0
        self.refused = 0
        self._server: asyncio.Server | None = None
        self._t0 = 0.0
        self._hold_until = 0.0
        self._cut_until = 0.0
        self._conns: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._handlers: set[asyncio.Task[Any]] = set()  # the server's connection handlers (`_accept`)
        self._closing = False
        self._holding = asyncio.Event()
        self._holding.set()  # set: not holding

    async def __aenter__(self) -> LinkProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        self._t0 = time.monotonic()
        for o in self.profile.outages:
            self._spawn(self._scheduled(o))

    async def close(self) -> None:
        """Stop accepting, end every connection and task, and return once they have ended."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        for a, b in list(self._conns):
            a.close()
            b.close()
        pending = [*self._tasks, *self._handlers]
        for t in pending:
            t.cancel()
        # gather, not `suppress(BaseException)` around each await: the tasks' own cancellation and errors are
        # expected here, but a cancellation of close() itself must still propagate.
        await asyncio.gather(*pending, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)

    # -- outages -----------------------------------------------------------
    def outage(self, duration_s: float, kind: OutageKind = OutageKind.CUT) -> None:
        """Start an outage now."""
        until = time.monotonic() + duration_s
        if kind is OutageKind.CUT:
            self._cut_until = max(self._cut_until, until)
            for a, b in list(self._conns):
                a.close()
                b.close()
        else:
            self._hold_until = max(self._hold_until, until)
            self._holding.clear()
            self._spawn(self._release_hold())

    @property
    def in_outage(self) -> bool:
        now = time.monotonic()
        return now < self._cut_until or now < self._hold_until

    async def _scheduled(self, o: Outage) -> None:
        await asyncio.sleep(max(0.0, self._t0 + o.at_s - time.monotonic()))
        self.outage(o.duration_s, o.kind)

    async def _release_hold(self) -> None:
        for _ in range(10_000):  # a later outage() may extend the hold while this one sleeps
            wait = self._hold_until - time.monotonic()
            if wait <= 0:
                break
            await asyncio.sleep(wait)
        self._holding.set()

    # -- forwarding --------------------------------------------------------
    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        me = asyncio.current_task()
        assert me is not None  # the server runs each handler as a task
        self._handlers.add(me)
        try:
            await self._serve(cr, cw)
        except asyncio.CancelledError:
            # close() cancelled this connection. Python 3.11's start_server logs a handler
            # task that ends cancelled as an error ("Exception in callback", fixed in 3.12),
            # so a handler the proxy itself stopped ends normally; any other cancellation
            # propagates.
            if not self._closing:
                raise
        finally:
            self._handlers.discard(me)

    async def _serve(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        if time.monotonic() < self._cut_until:
            self.refused += 1
            cw.close()
            return
        try:
            tr, tw = await asyncio.open_connection(*self.target)
        except OSError:
            self.refused += 1
            cw.close()
            return
        self.connections += 1
        pair = (cw, tw)
        self._conns.add(pair)
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._pipe(cr, tw, self.up))
                tg.create_task(self._pipe(tr, cw, self.down))
        except* (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._conns.discard(pair)
            cw.close()
            tw.close()

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, stats: DirectionStats) -> None:
        """Serialise through the bucket, then deliver after the one-way delay, in order."""
        bucket = TokenBucket(self.profile.bytes_per_s)
        delay = self.profile.delay_s
        inflight: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                item = await inflight.get()
                if item is None:
                    dst.close()
                    return
                at, data = item
                wait = at - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                await self._holding.wait()
                dst.write(data)
                await dst.drain()
                stats.bytes += len(data)
                stats.chunks += 1

        task = asyncio.ensure_future(deliver())
        try:
            while True:
                data = await src.read(MTU_BYTES)
                if not data:
                    break
                await self._holding.wait()
                await bucket.take(len(data))
                await inflight.put((time.monotonic() + delay, data))
            await inflight.put(None)
            await task
        finally:
            task.cancel()
            try:
                await asyncio.gather(task, return_exceptions=True)  # our own cancellation still propagates
            finally:
                dst.close()
