"""The shadow's KV side: watching `desired`, writing `reported` with revision checks.

Watching. nats-py's KV watch is an ordered push consumer; after a reconnect
to a restarted server it may be gone without a word. So the watcher is
re-created whenever the connection's reconnect count changes, and while idle
it compares the key's revision with a direct get every `resync_interval_s`,
so a missed update is found within that interval whatever happened. Every
(re)start delivers the key's current value first, so the reconciler always
works from the current document, not only from changes.

The watch is not nats-py's `kv.watch`: that creates its consumer through the
unfiltered `$JS.API.CONSUMER.CREATE.KV_TWIN_SHADOW`, so a credential allowed
to watch would be allowed to watch every vehicle's shadow. `KeyWatch` names
its consumer and creates it through the filtered subject
`$JS.API.CONSUMER.CREATE.KV_TWIN_SHADOW.<name>.$KV.TWIN_SHADOW.<key>` (the
server checks that the filter in the subject is the request's), so a vehicle's
permissions can name its own keys (docs/security.md).

That is one consumer per key. A gateway serving several vehicles watches
all their `desired` keys with one multi-filter consumer instead
(`mavjet.gateway.shadow.watch.SharedDesired`, same robustness rules); a
gateway serving one vehicle keeps `watch_key`, whose filtered create a
per-vehicle credential allows.

Writing. `reported` belongs to the gateway, but a second writer (an operator
script, a gateway that has not noticed a failover) may write it too. Every
write is `update(last=revision)`; on a revision conflict the writer re-reads
the key, lets the caller rebuild the document from what is there (to merge
the record of applied flight-state changes), and tries again, a bounded
number of times.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import nats.errors
import nats.js.errors
import structlog
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.kv import KeyValue

from mavjet.contract import natsadapter
from mavjet.contract.errors import MavjetError
from mavjet.contract.subjects import SHADOW_BUCKET, SHADOW_STREAM, shadow_kv_subject
from mavjet.drivers.mavlink.backoff import capped_delay_s
from mavjet.gateway.services import NatsAccess

log = structlog.get_logger("mavjet.shadow")

_DELETE_OPS = ("DEL", "PURGE")


class ShadowStoreError(MavjetError):
    """A shadow KV operation failed; `key` names the document."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"shadow {key}: {reason}")
        self.key = key
        self.reason = reason


@dataclass(frozen=True, slots=True)
class DesiredEntry:
    """A desired value as seen by the watcher (value None: absent or deleted)."""

    revision: int
    value: bytes | None


def entry_of(msg: Msg) -> DesiredEntry:
    """A watched KV message as an entry: the stream sequence is the key's revision; deletes and purges are None."""
    op = (msg.headers or {}).get("KV-Operation")
    value = None if op in _DELETE_OPS else msg.data
    return DesiredEntry(int(msg.metadata.sequence.stream), value)


def encode(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


class ShadowStore:
    """The TWIN_SHADOW bucket over the gateway's one NATS connection."""

    def __init__(self, publisher: NatsAccess, *, api_concurrency: int = 8) -> None:
        self.publisher = publisher
        # Watch consumers created at once, fleet-wide: a thousand vehicles starting together would
        # otherwise queue a thousand creates on a busy server, time out and retry (gateway/commands/consumer.py).
        self.api = anyio.CapacityLimiter(api_concurrency)
        self._kv: KeyValue | None = None
        self._kv_gen = -1
        self.ops = 0  # KV operations issued (benchmarks)

    def reconnects(self) -> int:
        nc = self.publisher.nc
        return int(nc.stats.get("reconnects", 0)) if nc is not None else 0

    async def kv(self) -> KeyValue:
        await self.publisher.connected.wait()
        js = self.publisher.js
        if js is None:
            raise ShadowStoreError(SHADOW_BUCKET, "not connected")
        gen = self.reconnects()
        if self._kv is None or gen != self._kv_gen:
            try:
                # Across a JetStream domain (a companion's leaf node) its writes need the domain's prefix.
                self._kv = natsadapter.key_value_across_domain(await js.key_value(SHADOW_BUCKET), js)
            except nats.js.errors.BucketNotFoundError as exc:
                raise ShadowStoreError(SHADOW_BUCKET, "bucket missing: run `mavjet provision`") from exc
            self._kv_gen = gen
        return self._kv

    async def get(self, key: str) -> DesiredEntry:
        kv = await self.kv()
        self.ops += 1
        try:
            e = await kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            return DesiredEntry(0, None)
        return DesiredEntry(int(e.revision or 0), e.value)

    async def put(self, key: str, doc: dict[str, Any]) -> int:
        kv = await self.kv()
        self.ops += 1
        return int(await kv.put(key, encode(doc)))


class KeyWatch:
    """Changes of one key through a named push consumer created on the filtered subject.

    The consumer is ephemeral: no acks, in memory, and removed by the server
    `inactive_s` after the subscription goes (so stopping needs no consumer
    delete permission).
    """

    def __init__(self, store: ShadowStore, key: str, *, inactive_s: float = 5.0) -> None:
        self.store = store
        self.key = key
        self.inactive_s = inactive_s
        self._sub: Subscription | None = None

    async def start(self) -> KeyWatch:
        nc, js = self.store.publisher.nc, self.store.publisher.js
        if nc is None or js is None:
            raise ShadowStoreError(self.key, "not connected")
        inbox = nc.new_inbox()
        self._sub = await nc.subscribe(inbox)
        config = ConsumerConfig(
            name=f"shadow_{secrets.token_hex(8)}",
            filter_subject=shadow_kv_subject(self.key),
            deliver_subject=inbox,
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=self.inactive_s,
            mem_storage=True,
            num_replicas=1,
        )
        try:
            async with self.store.api:
                await js.add_consumer(SHADOW_STREAM, config=config)
        except BaseException:
            await self.stop()
            raise
        return self

    async def updates(self, wait_s: float) -> DesiredEntry:
        """The next change; nats.errors.TimeoutError when none came within `wait_s`."""
        if self._sub is None:
            raise ShadowStoreError(self.key, "watch not started")
        return entry_of(await self._sub.next_msg(timeout=wait_s))

    async def stop(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            await sub.unsubscribe()


class ReportedWriter:
    """Writes one `reported` key with optimistic concurrency."""

    def __init__(self, store: ShadowStore, key: str, *, max_conflicts: int = 10) -> None:
        self.store = store
        self.key = key
        self.max_conflicts = max_conflicts
        self.revision: int | None = None  # None: not known, read before writing
        self.conflicts = 0
        self.writes = 0

    async def read(self) -> dict[str, Any] | None:
        """The stored document (None when absent or not a JSON object); learns its revision."""
        entry = await self.store.get(self.key)
        self.revision = entry.revision
        if entry.value is None:
            return None
        try:
            doc = json.loads(entry.value)
        except ValueError:
            return None
        return doc if isinstance(doc, dict) else None

    async def write(
        self, build: Callable[[dict[str, Any] | None], dict[str, Any]], current: dict[str, Any] | None = None
    ) -> int:
        """Write `build(stored)`; on a revision conflict re-read, rebuild and retry."""
        stored = current
        for _ in range(self.max_conflicts + 1):
            if self.revision is None:
                stored = await self.read()
            kv = await self.store.kv()
            data = encode(build(stored))
            self.store.ops += 1
            try:
                if not self.revision:
                    rev = await kv.create(self.key, data)
                else:
                    rev = await kv.update(self.key, data, last=self.revision)
            except nats.js.errors.KeyWrongLastSequenceError:
                self.conflicts += 1
                log.info("reported_conflict", key=self.key, expected=self.revision)
                self.revision = None
                continue
            self.revision = int(rev)
            self.writes += 1
            return self.revision
        raise ShadowStoreError(self.key, f"gave up after {self.max_conflicts} revision conflicts")


async def watch_key(
    store: ShadowStore,
    key: str,
    on_entry: Callable[[DesiredEntry], Awaitable[None] | None],
    *,
    resync_interval_s: float,
    retry_s: float = 0.5,
    retry_max_s: float = 10.0,
) -> None:
    """Deliver `key`'s current value, then every change, forever (until cancelled).

    Survives disconnects and server restarts (see the module docstring).
    Entries may repeat a revision; the receiver ignores those it has seen.
    """
    last_rev = -1

    async def deliver(entry: DesiredEntry) -> None:
        nonlocal last_rev
        if entry.revision == last_rev:
            return
        last_rev = entry.revision
        res = on_entry(entry)
        if res is not None:
            await res

    failures = 0
    while True:
        try:
            await store.kv()
            gen = store.reconnects()
            await deliver(await store.get(key))
            watcher = await KeyWatch(store, key).start()
            failures = 0
            try:
                while store.reconnects() == gen:
                    try:
                        entry = await watcher.updates(resync_interval_s)
                    except nats.errors.TimeoutError:
                        await deliver(await store.get(key))
                        continue
                    await deliver(entry)
            finally:
                with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
                    try:
                        await watcher.stop()
                    except Exception as exc:  # a dead subscription cannot be stopped: fine
                        log.debug("watch_stop_failed", key=key, error=repr(exc))
        except Exception as exc:  # nats-py raises a wide range; the watch is re-created after a backoff
            failures += 1
            log.warning("shadow_watch_restart", key=key, error=f"{type(exc).__name__}: {exc}", failures=failures)
            await anyio.sleep(capped_delay_s(failures, initial_s=retry_s, max_s=retry_max_s))
