"""The gateway's side of NATS: one connection, state publishing, the event spool drain.

- Connecting never blocks MAVLink intake: until the first connect succeeds the
  gateway keeps reading vehicles, spooling events and dropping stale state.
  The first connect retries with capped, jittered backoff; after that nats-py
  reconnects on its own (forever) and we follow its callbacks.
- State is latest-wins: most samples go out as plain publishes, every Nth with
  `publish_async` (bounded in flight, never awaited on the hot path); while
  disconnected it is dropped, because the next tick carries a newer sample
  anyway. A tick's samples are framed as HPUB commands and written as one
  buffer, the acked ones with a reply on one inbox (gateway/publish/statepub.py),
  instead of one `nc.publish` / `js.publish_async` each (docs/performance.md).
- Events go through the durable spool and are published oldest first with
  `Nats-Msg-Id`, so a republish after an outage is de-duplicated by the stream.
  The in-memory hand-off to the spool writer is bounded: when the writer falls
  behind (a stalled disk) the queue is written to the spool from the loop
  itself, which blocks intake instead of losing events or growing memory.
  Past the spool's bound what goes is chosen by the spool (`mavjet.gateway.publish.spool`:
  informational events first, busiest vehicle first, a `cmd_result` last).
- The event path is its own object, `events` (gateway/publish/eventpub.py,
  `EventPath`): the publisher makes it, hands it the connection and passes
  the event calls on to it.
- A command's result may skip the spool (`publish_event_now`): published
  and acked at once when its vehicle has no earlier event still waiting to
  be sent, so the vehicle's events keep their order; otherwise, and on any
  failure, it goes through the spool like every other event.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import anyio
import structlog
from anyio.abc import TaskStatus
from nats.aio.client import Client
from nats.js import JetStreamContext

from mavjet.contract import natsadapter, natsconn
from mavjet.contract.envelope import CONTENT_TYPE
from mavjet.drivers.mavlink.backoff import Backoff
from mavjet.drivers.mavlink.transport import limit_read_size
from mavjet.gateway.config import GatewayConfig
from mavjet.gateway.publish.eventpub import EventPath
from mavjet.gateway.publish.spool import Spool
from mavjet.gateway.publish.statepub import EventAcks, RawPublish, StateAcks, subscribe_direct
from mavjet.gateway.publish.uplink import UplinkMonitor
from mavjet.gateway.runtime.metrics import GatewayMetrics
from mavjet.gateway.twin.samples import StateSample

log = structlog.get_logger("mavjet.nats")


def _limit_nats_read_size(nc: Client) -> None:
    """nats-py reads through an asyncio stream: the same 256 KiB allocation per read (drivers/mavlink/transport.py)."""
    transport = natsadapter.stream_transport(nc)
    if transport is not None:
        limit_read_size(transport)


class Publisher:
    def __init__(self, cfg: GatewayConfig, spool: Spool, metrics: GatewayMetrics) -> None:
        self.cfg = cfg
        self.spool = spool
        self.metrics = metrics
        self.nc: Client | None = None
        self.js: JetStreamContext | None = None
        self.connected = anyio.Event()
        self.events = EventPath(cfg, spool, metrics)
        # Optional sink for each acked sample's receive->ack latency (ns). The metric's histogram
        # serves operators; a benchmark that wants exact percentiles plugs in here instead of the
        # publisher keeping a buffer nobody reads in production.
        self.on_state_ack: Callable[[int], None] | None = None
        self.state_published = 0
        self.state_dropped = 0
        self._inflight = 0
        self._state_seq = 0
        # Label lookups cost ~6 us each: resolve the hot-path children once.
        self._m_state_sent = metrics.publishes.labels(kind="state", result="plain")
        self._m_state_ok = metrics.publishes.labels(kind="state", result="acked")
        self._m_state_error = metrics.publishes.labels(kind="state", result="error")
        self._m_state_dropped = metrics.publishes.labels(kind="state", result="dropped")
        self._m_state_latency = metrics.publish_latency.labels(kind="state")
        self._state_error_logged = -1e9
        self._state_headers = {"Content-Type": CONTENT_TYPE}
        self._raw = RawPublish(self._state_headers)
        self._raw_ok = False  # set at connect: nats-py has the write buffer (`natsadapter.has_write_buffer`)
        self._shutting_down = False  # set by shutdown(): the disconnect that follows is ours
        self._acks: StateAcks | None = None
        # Link-adaptive shaping (gateway/publish/uplink.py): off while the uplink is healthy.
        self.uplink = UplinkMonitor(cfg.uplink, metrics=metrics.uplink,
                                    higher_pending=lambda: self.events.waiting)

    # -- the event path (`self.events`), as the daemon, its services and the benchmarks call it ----------
    @property
    def is_connected(self) -> bool:
        return self.nc is not None and self.nc.is_connected

    @property
    def events_waiting(self) -> bool:
        """Events handed over and not yet published: queued for the spool, or in it."""
        return self.events.waiting

    @property
    def events_enqueued(self) -> int:
        return self.events.events_enqueued

    @property
    def events_published(self) -> int:
        return self.events.events_published

    @property
    def events_direct(self) -> int:
        return self.events.events_direct

    def enqueue_event(self, subject: str, msg_id: str, payload: bytes) -> None:
        """Hot-path safe: hand an event to the spool writer (`EventPath.enqueue_event`)."""
        self.events.enqueue_event(subject, msg_id, payload)

    async def publish_event_now(self, subject: str, msg_id: str, payload: bytes) -> bool:
        """One event straight to JetStream, True once stored (`EventPath.publish_event_now`)."""
        return await self.events.publish_event_now(subject, msg_id, payload)

    async def flush_pending_to_spool(self) -> None:
        await self.events.flush_pending_to_spool()

    async def drain_spool_once(self) -> int:
        return await self.events.drain_spool_once()

    async def spool_drainer(self) -> None:
        await self.events.spool_drainer()

    # -- connection --------------------------------------------------------
    async def _on_disconnected(self) -> None:
        self.metrics.nats_connected.set(0)
        if self._shutting_down:  # our own drain and close: not something an operator must look into
            log.info("nats_closed", servers=list(self.cfg.nats.servers))
            return
        log.warning("nats_disconnected", servers=list(self.cfg.nats.servers))

    async def _on_reconnected(self) -> None:
        self.metrics.nats_connected.set(1)
        self.metrics.nats_reconnects.inc()
        url = natsconn.server_name(self.nc) if self.nc is not None else "?"
        if self.nc is not None:
            _limit_nats_read_size(self.nc)  # a new socket after a reconnect
        log.info("nats_reconnected", server=url)
        self.events.wake_drainer()

    async def _on_error(self, exc: Exception) -> None:
        self.metrics.nats_error(exc)
        log.warning("nats_error", error=f"{type(exc).__name__}: {exc}")

    async def connect_forever(self) -> None:
        opts = self.cfg.nats
        backoff = Backoff(initial_s=self.cfg.nats_backoff_initial_s, max_s=self.cfg.nats_backoff_max_s)
        while True:
            try:
                nc = await natsconn.connect(
                    opts,
                    name=f"mavjet-gateway/{self.cfg.instance}",
                    allow_reconnect=True,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=self.cfg.nats_backoff_initial_s,
                    disconnected_cb=self._on_disconnected,
                    reconnected_cb=self._on_reconnected,
                    error_cb=self._on_error,
                    pending_size=8 * 1024 * 1024,
                )
            except natsconn.NatsUnavailable as exc:
                self.metrics.nats_connected.set(0)
                delay = backoff.next_delay_s()
                log.warning("nats_unreachable", servers=list(opts.servers), error=exc.reason,
                            retry_in_s=round(delay, 2))
                await anyio.sleep(delay)
                continue
            self.nc = nc
            _limit_nats_read_size(nc)
            self._raw_ok = natsadapter.has_write_buffer(nc)
            event_acks: EventAcks | None = None
            if self._raw_ok:
                acks = StateAcks(nc.new_inbox(), timeout_ns=int(self.cfg.publish_timeout_s * 1e9),
                                 on_ack=self._state_acked, on_error=self._state_failed)
                await subscribe_direct(nc, acks.subject, acks.on_msg)
                self._acks = acks
                event_acks = EventAcks(nc.new_inbox())
                await subscribe_direct(nc, event_acks.subject, event_acks.on_msg)
            js = self.js = nc.jetstream(timeout=self.cfg.publish_timeout_s, domain=self.cfg.nats.domain,
                                        publish_async_max_pending=self.cfg.max_inflight_state)
            self.metrics.nats_connected.set(1)
            log.info("nats_connected", server=natsconn.server_name(nc))  # host:port, never the URL's userinfo
            self.connected.set()
            self.events.attach(nc, js, event_acks)  # wakes the drainer
            return

    # -- state -------------------------------------------------------------
    def _state_done(self, fut: asyncio.Future[Any], recv_ns: int) -> None:
        self._inflight -= 1
        if fut.cancelled() or fut.exception() is not None:
            self._m_state_error.inc()
            now = time.monotonic()
            if now - self._state_error_logged >= 10.0:
                self._state_error_logged = now
                exc = None if fut.cancelled() else fut.exception()
                log.warning("state_not_acked", error=f"{type(exc).__name__}: {exc}" if exc else "cancelled",
                            hint="is TWIN_STATE provisioned for this env? (mavjet provision)")
            return
        lat = time.time_ns() - recv_ns
        if self.on_state_ack is not None:
            self.on_state_ack(lat)
        self._m_state_latency.observe(lat / 1e9)
        self._m_state_ok.inc()

    def _state_acked(self, recv_ns: int) -> None:
        self._inflight -= 1
        lat = time.time_ns() - recv_ns
        if self.on_state_ack is not None:
            self.on_state_ack(lat)
        self._m_state_latency.observe(lat / 1e9)
        self._m_state_ok.inc()

    def _state_failed(self, reason: str) -> None:
        self._inflight -= 1
        self._m_state_error.inc()
        now = time.monotonic()
        if now - self._state_error_logged >= 10.0:
            self._state_error_logged = now
            log.warning("state_not_acked", error=reason,
                        hint="is TWIN_STATE provisioned for this env? (mavjet provision)")

    async def _publish_state_api(self, subject: str, payload: bytes, recv_ns: int) -> None:
        """One sample through nats-py's own API: without its write buffer, or while not connected."""
        js, nc = self.js, self.nc
        if js is None or nc is None or not nc.is_connected or self._inflight >= self.cfg.max_inflight_state:
            self.state_dropped += 1
            self._m_state_dropped.inc()
            return
        self._state_seq += 1
        if self._state_seq % self.cfg.state_ack_every:
            # Most state goes out as a plain publish: the stream stores it all
            # the same, without a JSON ack to parse per message (~4x cheaper,
            # docs/decisions.md). Every Nth is acked to prove the stream is
            # storing and to measure receive-to-ack latency.
            try:
                await nc.publish(subject, payload, headers=self._state_headers)
            except Exception:
                self.state_dropped += 1
                self._m_state_dropped.inc()
                return
            self.state_published += 1
            self._m_state_sent.inc()
            return
        try:
            fut = await js.publish_async(subject, payload, wait_stall=0.05, headers=self._state_headers)
        except Exception:
            self.state_dropped += 1
            self._m_state_dropped.inc()
            return
        self._inflight += 1
        self.state_published += 1
        fut.add_done_callback(lambda f: self._state_done(f, recv_ns))

    async def publish_states(self, batch: list[StateSample]) -> None:
        """A tick's state samples (subject, payload, receive time), in order, as one buffer write.

        Every Nth sample carries a reply subject for its JetStream ack (latency,
        proof of storage); the rest are plain. Past `max_inflight_state`
        unacked samples the server is behind and state is dropped, not queued.
        """
        if self.uplink.cfg.enabled:  # a thin uplink: decimated per channel, newest held (gateway/publish/uplink.py)
            batch = self.uplink.admit_states(batch, time.monotonic_ns())
        nc, acks = self.nc, self._acks
        if not self._raw_ok or acks is None or nc is None or not nc.is_connected:
            for subject, payload, recv_ns in batch:
                await self._publish_state_api(subject, payload, recv_ns)
            return
        now_ns = time.monotonic_ns()
        acks.expire(now_ns)
        if self._inflight >= self.cfg.max_inflight_state:
            self.state_dropped += len(batch)
            self._m_state_dropped.inc(len(batch))
            return
        every = self.cfg.state_ack_every
        max_payload = nc.max_payload
        frame = self._raw.frame
        cmds: list[bytes] = []
        seq = self._state_seq
        acked = 0
        for subject, payload, recv_ns in batch:
            if len(payload) > max_payload:
                self.state_dropped += 1
                self._m_state_dropped.inc()
                continue
            seq += 1
            if seq % every:
                cmds.append(frame(subject, payload))
            else:
                cmds.append(frame(subject, payload, acks.add(recv_ns, now_ns)))
                acked += 1
        self._state_seq = seq
        if not cmds:
            return
        self._inflight += acked
        try:
            await natsadapter.write_commands(nc, cmds)
        except Exception:
            self.state_dropped += len(cmds)
            self._m_state_dropped.inc(len(cmds))
            return
        self.state_published += len(cmds)
        self._m_state_sent.inc(len(cmds) - acked)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.events.spool_writer, name="nats.spool_writer")
            task_status.started()
            await self.connect_forever()
            tg.start_soon(self.events.spool_drainer, name="nats.spool_drainer")
            tg.start_soon(self.uplink.run, lambda: self.nc, name="nats.uplink")

    async def shutdown(self, timeout_s: float) -> None:
        """Flush what is queued, publish the spool, drain the connection. Bounded by `timeout_s`."""
        self._shutting_down = True
        with anyio.move_on_after(timeout_s) as scope:
            await self.flush_pending_to_spool()
            if self.is_connected:
                try:
                    await self.drain_spool_once()
                except Exception as exc:
                    log.warning("shutdown_drain_incomplete", error=str(exc), spooled=self.spool.depth)
            if self.nc is not None and self.nc.is_connected:
                try:
                    await self.nc.drain()
                except Exception as exc:
                    log.warning("nats_drain_failed", error=str(exc))
        if scope.cancelled_caught:
            log.warning("shutdown_timeout", spooled=self.spool.depth)
        if self.nc is not None:
            why = await natsconn.close(self.nc)
            if why is not None:  # the server went first; what was not published is in the spool, flushed above
                log.info("nats_close_failed", error=why, spooled=self.spool.depth)
