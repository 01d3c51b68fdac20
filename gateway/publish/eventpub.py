"""The publisher's event path: the hand-over to the spool, the spool's drain, a result straight to the stream.

`EventPath` is one part of `mavjet.gateway.publish.publisher.Publisher`,
which makes it, hands it the connection once made (`attach`) and passes the
event calls on to it; the state path and the connection stay in the
publisher. The rules are the publisher's (gateway/publish/publisher.py):
every event goes through the durable spool, oldest first, with
`Nats-Msg-Id`; a command's result may skip it when that keeps its vehicle's
events in order (`publish_event_now`).
"""

from __future__ import annotations

import time
from collections import deque

import anyio
import structlog
from nats.aio.client import Client
from nats.js import JetStreamContext

from mavjet.contract import natsadapter
from mavjet.contract.envelope import CONTENT_TYPE
from mavjet.drivers.mavlink.backoff import Backoff
from mavjet.gateway.config import GatewayConfig
from mavjet.gateway.publish.eventorder import EventsOnTheWay
from mavjet.gateway.publish.spool import DROP_ORDER, Drops, Spool, SpoolEntry
from mavjet.gateway.publish.spooldrain import drain_spool
from mavjet.gateway.publish.statepub import EventAcks, RawPublish, pub_ack_error
from mavjet.gateway.runtime.metrics import GatewayMetrics

log = structlog.get_logger("mavjet.nats")

# Events waiting for the spool writer. The writer takes the whole queue per
# transaction, so the queue only grows while one write is slow; far above any
# burst the vehicles produce (a burst is a few events per vehicle).
MAX_PENDING_EVENTS = 10_000


class EventPath:
    """Events to the spool and from it to JetStream (see the module docstring)."""

    def __init__(self, cfg: GatewayConfig, spool: Spool, metrics: GatewayMetrics) -> None:
        self.cfg = cfg
        self.spool = spool
        self.metrics = metrics
        # The connection, set by `attach` once the publisher has one.
        self.nc: Client | None = None
        self.js: JetStreamContext | None = None
        self._raw_ok = False  # the HPUB can go through nats-py's write buffer (`natsadapter.write_now`)
        self._event_acks: EventAcks | None = None  # the direct publishes' (`publish_event_now`)
        self._pending_events: deque[tuple[str, str, bytes]] = deque()
        self._on_the_way = EventsOnTheWay()  # whose results may skip the spool (`publish_event_now`)
        self._writing = 0  # events taken from the queue whose spool write is under way
        self.events_direct = 0  # results published by `publish_event_now`, without the spool
        self.max_pending_events = MAX_PENDING_EVENTS
        self.events_spilled = 0  # events written to the spool from the loop because the queue was full
        self.events_published = 0
        self.events_enqueued = 0  # every event handed over, for "no event lost" checks (mavjet bench ingest)
        self._events_ready = anyio.Event()
        self._spool_ready = anyio.Event()
        # Every class is exported from the start (at 0), so an alert can use increase() on it.
        self._m_spool_dropped = {cls.value: metrics.spool_dropped.labels(cls.value) for cls in DROP_ORDER}

    def attach(self, nc: Client, js: JetStreamContext, acks: EventAcks | None) -> None:
        """The publisher's connection; `acks` when results may go through nats-py's write buffer."""
        self.nc, self.js = nc, js
        self._raw_ok, self._event_acks = acks is not None, acks
        self.wake_drainer()

    def wake_drainer(self) -> None:
        """Have the drainer look at the spool (a connect, a reconnect, a write)."""
        self._spool_ready.set()

    @property
    def waiting(self) -> bool:
        """Events handed over and not yet published: queued for the spool, or in it."""
        return bool(self._pending_events) or self.spool.depth > 0

    @property
    def is_connected(self) -> bool:
        return self.nc is not None and self.nc.is_connected

    def enqueue_event(self, subject: str, msg_id: str, payload: bytes) -> None:
        """Hot-path safe: hand an event to the spool writer (no I/O here unless the queue is full)."""
        self._pending_events.append((subject, msg_id, payload))
        self.events_enqueued += 1
        self._on_the_way.handed(subject)
        self._events_ready.set()
        if len(self._pending_events) >= self.max_pending_events:
            self._spill()

    def _spill(self) -> None:
        """The writer is behind: write the queue to the spool now, blocking the loop (nothing is lost).

        Order holds: the spool's one worker thread runs writes in submission
        order, and the queue holds only events newer than any write under way.
        """
        batch = list(self._pending_events)
        self._pending_events.clear()
        self.events_spilled += len(batch)
        self.metrics.errors.labels(where="event_queue_full").inc()
        log.warning("event_queue_full_spilled", events=len(batch), bound=self.max_pending_events)
        self._spooled(self.spool.append_sync(batch))

    def _spooled(self, drops: Drops) -> None:
        # Counted here per write; logged by the spool once per overflow episode.
        for cls, n in drops.by_class.items():
            self._m_spool_dropped[cls].inc(n)
        self.metrics.spool_depth.set(self.spool.depth)
        self.wake_drainer()

    async def flush_pending_to_spool(self) -> None:
        if not self._pending_events:
            return
        batch = list(self._pending_events)
        self._pending_events.clear()
        self._writing += len(batch)
        try:
            self._spooled(await self.spool.append(batch))
        finally:
            self._writing -= len(batch)

    async def spool_writer(self) -> None:
        while True:
            await self._events_ready.wait()
            self._events_ready = anyio.Event()
            await self.flush_pending_to_spool()

    async def drain_spool_once(self) -> int:
        """Publish spooled events in order until the spool is empty; returns how many."""
        js = self.js
        if js is None or not self.is_connected:
            return 0
        return await drain_spool(self.spool, js, timeout_s=self.cfg.publish_timeout_s,
                                 on_acked=self._events_acked, on_error=self._drain_failed,
                                 on_sent=self._events_sent)

    def _events_sent(self, batch: list[SpoolEntry]) -> None:
        self._on_the_way.sent(e.subject for e in batch)

    async def publish_event_now(self, subject: str, msg_id: str, payload: bytes) -> bool:
        """Publish one event to JetStream without the spool; True once the stream has it.

        For command results (docs/commands.md, "Handing the result over").
        False, with nothing published, when that could reorder the vehicle's
        events (`mavjet.gateway.publish.eventorder`) or the connection is down; False after
        an error or no ack in `publish_timeout_s` too: the caller spools it
        then, and the stream drops a second copy by its `Nats-Msg-Id`.
        """
        js = self.js
        self._on_the_way.settle(spool_empty=self.spool.opened and self.spool.depth == 0 and not self._writing,
                                queue_empty=not self._pending_events)
        if js is None or not self.is_connected or not self._on_the_way.clear(subject):
            return False
        hdrs = {"Content-Type": CONTENT_TYPE, "Nats-Msg-Id": msg_id}
        t0 = time.monotonic()
        nc, acks = self.nc, self._event_acks
        if self._raw_ok and acks is not None and nc is not None:
            error = await self._publish_event_raw(nc, acks, subject, hdrs, payload)
            if error is not None:
                self._event_publish_failed(error)
                return False  # not counted as handed over: the caller hands it to the spool
        else:
            try:  # js.publish times the ack out itself (unlike publish_async in the drain)
                await js.publish(subject, payload, headers=hdrs, timeout=self.cfg.publish_timeout_s)
            except Exception as exc:  # nats-py raises a wide range; the spool is the way that cannot fail here
                self._event_publish_failed(f"{type(exc).__name__}: {exc}")
                return False
        self.events_enqueued += 1
        self.events_direct += 1
        self._events_acked(1, time.monotonic() - t0)
        return True

    async def _publish_event_raw(self, nc: Client, acks: EventAcks, subject: str, headers: dict[str, str],
                                 payload: bytes) -> str | None:
        """`js.publish` with the command on the socket at once (`natsadapter.write_now`); None once stored."""
        if len(payload) > nc.max_payload:
            return f"{len(payload)} bytes, over the server's max_payload {nc.max_payload}"
        reply, fut = acks.add()
        try:
            if not natsadapter.write_now(nc, RawPublish.frame_once(subject, reply, headers, payload)):
                return "no connection"
            with anyio.move_on_after(self.cfg.publish_timeout_s):
                ack = await fut
                return pub_ack_error(ack.data, ack.headers)
            return f"no ack within {self.cfg.publish_timeout_s} s"
        finally:
            acks.discard(reply)

    def _events_acked(self, n: int, elapsed_s: float) -> None:
        self.metrics.publishes.labels(kind="event", result="acked").inc(n)
        self.metrics.publish_latency.labels(kind="event").observe(elapsed_s / n)
        self.events_published += n
        self.metrics.spool_depth.set(self.spool.depth)

    def _drain_failed(self, exc: Exception) -> None:
        self._event_publish_failed(f"{type(exc).__name__}: {exc}")

    def _event_publish_failed(self, error: str) -> None:
        self.metrics.publishes.labels(kind="event", result="error").inc()
        log.warning("event_publish_failed", error=error, spooled=self.spool.depth)

    async def spool_drainer(self) -> None:
        backoff = Backoff(initial_s=self.cfg.nats_backoff_initial_s, max_s=self.cfg.nats_backoff_max_s)
        while True:
            await self._spool_ready.wait()
            self._spool_ready = anyio.Event()
            try:
                await self.drain_spool_once()
                backoff.reset()
            except Exception:
                self._spool_ready.set()
                await anyio.sleep(backoff.next_delay_s())

