"""Where a reconciler hears its vehicle's `desired`: one watch per key, or one watch per gateway.

`KeyDesired` is the per-key watch (`kvstore.watch_key`): one consumer per
vehicle, created through the filtered subject a per-vehicle credential may
use. A gateway serving one vehicle (a companion computer) keeps it.

`SharedDesired` is one ephemeral push consumer on KV_TWIN_SHADOW for all the
gateway's vehicles (one per `MAX_FILTERS` = 500 of them: see there):
`filter_subjects` lists their `desired` subjects (nats-server 2.10+),
DeliverPolicy LAST_PER_SUBJECT, so every (re)start delivers each key's
current value first, then every change. Entries are routed by subject to the
vehicle's listener; the last one seen per key is kept, so a reconciler that
(re)starts (it became the owner again) gets the current value at once
instead of waiting for the next change. At 10,000 vehicles it is 20
consumers instead of 10,000 (issue 50); up to 500 vehicles, one.

A multi-filter consumer can only be created through the unfiltered
`$JS.API.CONSUMER.CREATE.KV_TWIN_SHADOW.<name>` subject (the server refuses
a multi-filter request on the filtered form), which the server cannot check
against the credential's keys: hub credentials carry that permission
(ops/auth.py, docs/security.md), per-vehicle ones do not, which is why one
vehicle keeps the per-key watch.

Robustness, as for the per-key watch (kvstore.py's docstring):
- re-created whenever the connection's reconnect count changes;
- a gap in the consumer sequence (nats-py dropped a message as a slow
  consumer) re-creates it at once;
- every `resync_interval_s` one consumer-info request (not a get per key: a
  thousand vehicles would mean a thousand gets each interval) checks that
  the consumer still exists, that we have everything it says it delivered,
  and that it is not stalled with messages pending; any of those re-creates
  it, and the re-creation delivers every key's current value again. So a
  missed update is found within about that interval, with one request.
- deleted or purged keys arrive as None; a key with no message left in the
  stream (never written, or removed by an administrator's stream purge) is
  delivered as absent (revision 0) once the consumer's initial snapshot
  (its `num_pending` at creation) has been delivered.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterable
from typing import Protocol

import anyio
import nats.errors
import nats.js.errors
import structlog
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import AckPolicy, ConsumerConfig, ConsumerInfo, DeliverPolicy

from mavjet.contract.subjects import SHADOW_STREAM, shadow_kv_subject
from mavjet.drivers.mavlink.backoff import capped_delay_s
from mavjet.gateway.shadow.kvstore import (
    DesiredEntry,
    ShadowStore,
    ShadowStoreError,
    entry_of,
    watch_key,
)

log = structlog.get_logger("mavjet.shadow")

DesiredListener = Callable[[DesiredEntry], None]

_ABSENT = DesiredEntry(0, None)
_PREFIX = shadow_kv_subject("")


class DesiredSource(Protocol):
    """Delivers one key's current value, then every change, until cancelled."""

    async def follow(self, key: str, on_entry: DesiredListener) -> None: ...


class KeyDesired:
    """One consumer per key (`watch_key`): what a single-vehicle gateway uses."""

    def __init__(self, store: ShadowStore, *, resync_interval_s: float) -> None:
        self.store = store
        self.resync_interval_s = resync_interval_s

    async def follow(self, key: str, on_entry: DesiredListener) -> None:
        await watch_key(self.store, key, on_entry, resync_interval_s=self.resync_interval_s)


class _Restart(Exception):  # a control-flow signal inside SharedDesired.run, never raised to a caller
    """The consumer must be re-created (the reason is logged)."""


# nats-server's time to create a multi-filter consumer grows with the square of its filters
# (measured on 2.15: 1,000 filters 0.16 s, 2,000 0.54 s, 4,000 2.1 s, 10,000 over 10 s: the API
# request times out and the watch never starts). So the keys are split into consumers of at most
# this many filters: 10,000 vehicles make 20 consumers (instead of 10,000) at ~0.05 s each.
MAX_FILTERS = 500


class SharedDesired:
    """One multi-filter consumer per `max_filters` keys; `run()` keeps them, `follow()` listens to one key."""

    def __init__(self, store: ShadowStore, keys: Iterable[str], *, resync_interval_s: float,
                 retry_s: float = 0.5, retry_max_s: float = 10.0, inactive_s: float = 5.0,
                 grace_s: float = 1.0, max_filters: int = MAX_FILTERS) -> None:
        self.store = store
        self.keys = sorted(set(keys))
        self.resync_interval_s = resync_interval_s
        self.retry_s = retry_s
        self.retry_max_s = retry_max_s
        self.inactive_s = inactive_s
        # How long deliveries the server counted may take to reach us before they count as lost.
        self.grace_s = grace_s
        self.last: dict[str, DesiredEntry] = {}  # last entry delivered per key (handed to a new listener)
        self._listeners: dict[str, DesiredListener] = {}
        self._keyset = frozenset(self.keys)
        self.groups = [_Group(self, self.keys[i:i + max_filters]) for i in range(0, len(self.keys), max_filters)]
        self.ready = anyio.Event()  # set once every consumer's initial snapshot is delivered
        if not self.groups:
            self.ready.set()

    # Counters over the consumers (tests, benchmarks, logs)
    @property
    def consumers_created(self) -> int:
        return sum(g.consumers_created for g in self.groups)

    @property
    def restarts(self) -> int:
        return sum(g.restarts for g in self.groups)

    @property
    def checks(self) -> int:
        return min((g.checks for g in self.groups), default=0)

    @property
    def consumer_names(self) -> list[str]:
        return [g.consumer_name for g in self.groups if g.consumer_name is not None]

    # -- listeners ---------------------------------------------------------------------
    async def follow(self, key: str, on_entry: DesiredListener) -> None:
        if key not in self._keyset:
            raise ShadowStoreError(key, "not one of the keys this watch covers")
        if key in self._listeners:
            raise ShadowStoreError(key, "already followed")
        self._listeners[key] = on_entry
        try:
            cached = self.last.get(key)
            if cached is not None:
                on_entry(cached)
            await anyio.sleep_forever()
        finally:
            if self._listeners.get(key) is on_entry:
                del self._listeners[key]

    def deliver(self, key: str, entry: DesiredEntry) -> None:
        prev = self.last.get(key)
        if prev is not None and prev.revision == entry.revision:
            return  # a re-created consumer delivers the current values again
        self.last[key] = entry
        listener = self._listeners.get(key)
        if listener is not None:
            try:
                listener(entry)
            except Exception:  # one vehicle's bug must not stop the others' watch
                log.exception("shadow_listener_failed", key=key)

    def group_ready(self) -> None:
        if all(g.snapshot_done_once for g in self.groups):
            self.ready.set()

    async def run(self) -> None:
        """Keep every consumer (re-created as the module docstring says) until cancelled."""
        async with anyio.create_task_group() as tg:
            for i, g in enumerate(self.groups):
                tg.start_soon(g.run, name=f"shadow.watch[{i}]")
            await anyio.sleep_forever()


class _Group:
    """One multi-filter consumer over a slice of the keys."""

    def __init__(self, owner: SharedDesired, keys: list[str]) -> None:
        self.owner = owner
        self.store = owner.store
        self.keys = keys
        self._keyset = frozenset(keys)
        self.consumers_created = 0
        self.restarts = 0
        self.checks = 0
        self.consumer_name: str | None = None
        self.snapshot_done_once = False
        # Per consumer: the last consumer sequence received and the snapshot still to come.
        self._seq = 0
        self._snapshot_seq = 0
        self._snapshot_done = False
        self._seen: set[str] = set()

    # -- the consumer ------------------------------------------------------------------
    def _config(self, inbox: str) -> ConsumerConfig:
        return ConsumerConfig(
            name=f"shadow_{secrets.token_hex(8)}",
            filter_subjects=[shadow_kv_subject(k) for k in self.keys],
            deliver_subject=inbox,
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=self.owner.inactive_s,
            mem_storage=True,
            num_replicas=1,
        )

    async def run(self) -> None:
        """Keep the consumer (re-created as the module docstring says) until cancelled."""
        o = self.owner
        failures = 0
        while True:
            sub: Subscription | None = None
            try:
                await self.store.kv()
                gen = self.store.reconnects()
                nc, js = self.store.publisher.nc, self.store.publisher.js
                if nc is None or js is None:
                    raise ShadowStoreError(SHADOW_STREAM, "not connected")
                inbox = nc.new_inbox()
                sub = await nc.subscribe(inbox)
                config = self._config(inbox)
                async with self.store.api:
                    info = await js.add_consumer(SHADOW_STREAM, config=config)
                self.consumers_created += 1
                self.consumer_name = config.name
                self._seq, self._seen, self._snapshot_done = 0, set(), False
                self._snapshot_seq = int(info.num_pending or 0)
                log.info("shadow_watch_started", consumer=config.name, keys=len(self.keys),
                         snapshot=self._snapshot_seq)
                failures = 0
                self._check_snapshot()
                await self._serve(sub, gen)
            except _Restart as why:
                self.restarts += 1
                log.info("shadow_watch_recreate", keys=len(self.keys), reason=str(why))
                # Not at once: a cause that persists (a stalled server) must not become a create loop.
                await anyio.sleep(o.retry_s)
            except Exception as exc:  # nats-py raises a wide range; re-created after a backoff
                failures += 1
                log.warning("shadow_watch_restart", keys=len(self.keys), error=f"{type(exc).__name__}: {exc}",
                            failures=failures)
                await anyio.sleep(capped_delay_s(failures, initial_s=o.retry_s, max_s=o.retry_max_s))
            finally:
                if sub is not None:
                    with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
                        try:
                            await sub.unsubscribe()
                        except Exception as exc:  # a dead subscription cannot be stopped: fine
                            log.debug("watch_stop_failed", error=repr(exc))

    async def _serve(self, sub: Subscription, gen: int) -> None:
        next_check = time.monotonic() + self.owner.resync_interval_s
        last_delivered = -1
        while self.store.reconnects() == gen:
            wait = next_check - time.monotonic()
            if wait > 0:
                try:
                    msg = await sub.next_msg(timeout=wait)
                except nats.errors.TimeoutError:
                    continue
                self._on_msg(msg)
                continue
            next_check = time.monotonic() + self.owner.resync_interval_s
            last_delivered = await self._check(sub, last_delivered)

    def _on_msg(self, msg: Msg) -> None:
        meta = msg.metadata
        if meta.sequence.consumer != self._seq + 1:
            raise _Restart(f"consumer sequence gap: {self._seq} then {meta.sequence.consumer}")
        self._seq = meta.sequence.consumer
        key = msg.subject[len(_PREFIX):]
        if key in self._keyset:
            self._seen.add(key)
            self.owner.deliver(key, entry_of(msg))
        self._check_snapshot()

    def _check_snapshot(self) -> None:
        """Once the initial snapshot is in, a key not in it has no value: deliver it as absent."""
        if self._snapshot_done or self._seq < self._snapshot_seq:
            return
        self._snapshot_done = True
        for key in self.keys:
            if key not in self._seen:
                self.owner.deliver(key, _ABSENT)
        self.snapshot_done_once = True
        self.owner.group_ready()

    async def _check(self, sub: Subscription, last_delivered: int) -> int:
        """One consumer-info request: gone, lost deliveries or stalled → re-create. Returns what it delivered."""
        self.checks += 1
        js = self.store.publisher.js
        if js is None or self.consumer_name is None:
            raise _Restart("not connected")
        try:
            self.store.ops += 1
            info: ConsumerInfo = await js.consumer_info(SHADOW_STREAM, self.consumer_name)
        except nats.js.errors.NotFoundError as exc:
            raise _Restart("consumer gone") from exc
        delivered = int(info.delivered.consumer_seq if info.delivered else 0)
        # Messages the server counted may still be on their way: wait a little for them.
        until = time.monotonic() + self.owner.grace_s
        while self._seq < delivered and (left := until - time.monotonic()) > 0:
            try:
                msg = await sub.next_msg(timeout=left)
            except nats.errors.TimeoutError:
                break
            self._on_msg(msg)
        if self._seq < delivered:
            raise _Restart(f"lost deliveries: received {self._seq} of {delivered}")
        if (info.num_pending or 0) > 0 and delivered == last_delivered:
            raise _Restart(f"stalled with {info.num_pending} pending")
        return delivered
