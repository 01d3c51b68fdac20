"""TWIN_LOGS: flight logs under each vehicle's own subjects, so the server can enforce "only its own".

TWIN_BLOBS cannot say "a vehicle writes only `logs/<vid>/`": an object-store
record's subject is the base64 of its whole name (one token) and its chunks
are hash-addressed, so no subject pattern matches one vehicle's objects. Here
every subject of a vehicle's logs starts with `fleet.<env>.veh.<vid>.logs.`:

- `...logs.c.<sha256 hex>`: the log's bytes in chunks, written by
  `mavjet.gateway.stores.chunks.put_chunks` (the same code TWIN_BLOBS uses: the stream is the
  upload journal, a cut upload resumes after the last stored chunk, a log
  stored twice is sent once);
- `...logs.n.<log id>-<date>.bin`: the name record (sha256, size, chunks),
  one per log, rolled up to the newest.

A reader needs no stream-wide permission: records are read with direct gets
by subject (`$JS.API.DIRECT.GET.TWIN_LOGS.<subject>`) or listed by a consumer
created on the filtered subject (`$JS.API.CONSUMER.CREATE.TWIN_LOGS.<name>.<filter>`,
which the server checks against the consumer's filter), and chunks arrive
through such a consumer too. So a vehicle credential allowed
`fleet.<env>.veh.<vid>.logs.>` reads and writes its own logs and nothing else
(docs/security.md). A log is named `logs/<vid>/<log id>-<date>.bin` to people.
"""

from __future__ import annotations

import json
import secrets
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
from nats.aio.subscription import Subscription
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from mavjet.contract import natsadapter
from mavjet.contract.subjects import (
    LOGS_STREAM,
    log_chunk_subject,
    log_record_subject,
    log_records_filter,
)
from mavjet.gateway.publish.uplink import BulkPacer
from mavjet.gateway.stores.chunks import (
    CHUNK_HEADER,
    DEFAULT_CHUNK_BYTES,
    BlobError,
    BlobFailure,
    Chunk,
    Chunks,
    Progress,
    Source,
    Transfer,
    Wanted,
    get_chunks,
    object_digest,
    put_chunks,
)

OBJECT_PREFIX = "logs/"
_CONSUMER_INACTIVE_S = 5.0  # an abandoned reader's consumer goes by itself: no delete permission needed
_READ_TIMEOUT_S = 10.0


def object_name(vid: str, name: str) -> str:
    return f"{OBJECT_PREFIX}{vid}/{name}"


def split_object(obj: str) -> tuple[str, str]:
    """`logs/<vid>/<name>` -> (vid, name); ValueError otherwise."""
    parts = obj.split("/")
    if len(parts) != 3 or parts[0] != OBJECT_PREFIX.rstrip("/") or not parts[1] or not parts[2]:
        raise ValueError(f"{obj!r} is not logs/<vid>/<name>")
    return parts[1], parts[2]


@dataclass(frozen=True, kw_only=True)
class LogRecord:
    vid: str
    name: str  # <log id>-<date>.bin
    sha256: str
    size_bytes: int
    chunks: int
    mtime: str
    log_id: int | None = None

    @property
    def object(self) -> str:
        return object_name(self.vid, self.name)

    def to_json(self) -> dict[str, Any]:
        return {"vid": self.vid, "name": self.name, "sha256": self.sha256, "size": self.size_bytes,
                "chunks": self.chunks, "mtime": self.mtime, "log_id": self.log_id}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> LogRecord:
        log_id = doc.get("log_id")
        return cls(vid=str(doc["vid"]), name=str(doc["name"]), sha256=str(doc["sha256"]),
                   size_bytes=int(doc["size"]), chunks=int(doc["chunks"]), mtime=str(doc.get("mtime") or ""),
                   log_id=int(log_id) if log_id is not None else None)


async def read_record(js: JetStreamContext, env: str, vid: str, name: str) -> LogRecord | None:
    """The name record of one log (a direct get by its subject), or None."""
    subject = log_record_subject(env, vid, name)
    try:
        msg = await js.get_last_msg(LOGS_STREAM, subject, direct=True)
    except NotFoundError:
        return None
    except Exception as exc:  # nats-py raises a wide range here; translated at this boundary
        raise BlobError(object_name(vid, name), BlobFailure.UNREADABLE, type(exc).__name__, str(exc),
                        store=LOGS_STREAM) from exc
    try:
        return LogRecord.from_json(json.loads(msg.data or b"{}"))
    except (KeyError, TypeError, ValueError) as exc:
        raise BlobError(object_name(vid, name), BlobFailure.CORRUPT, type(exc).__name__, str(exc),
                        store=LOGS_STREAM) from exc


async def put_log(
    js: JetStreamContext, env: str, vid: str, name: str, data: bytes | Path, *, log_id: int | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES, progress: Progress | None = None, pacer: BulkPacer | None = None,
) -> Transfer:  # fmt: skip
    """Store one log of `vid` (resuming a cut upload; sent once per content); raises BlobError."""
    label = object_name(vid, name)
    record_subject = log_record_subject(env, vid, name)
    src = Source(data)
    hex_ = await src.sha256()
    where = Chunks(stream=LOGS_STREAM, subject=log_chunk_subject(env, vid, hex_), scoped=True, store=LOGS_STREAM)
    old = await read_record(js, env, vid, name)
    if old is not None and old.sha256 == hex_:
        if progress:
            progress(src.size, src.size)
        return Transfer(name=label, sha256=hex_, size_bytes=src.size, chunks=old.chunks, sent_chunks=0,
                        sent_bytes=0, resumed_at_chunk=old.chunks, already_present=True)
    sent = await put_chunks(js, where, src, hex_, label=label, chunk_bytes=chunk_bytes, progress=progress,
                            pacer=pacer)
    record = LogRecord(vid=vid, name=name, sha256=hex_, size_bytes=src.size, chunks=sent.chunks,
                       mtime=datetime.now(UTC).isoformat(), log_id=log_id)
    try:
        # Rollup: only the newest record per log is kept.
        await js.publish(record_subject, json.dumps(record.to_json()).encode(), stream=LOGS_STREAM,
                         headers={"Nats-Rollup": "sub"})
    except Exception as exc:  # translated at this boundary
        raise BlobError(label, BlobFailure.UNWRITABLE, type(exc).__name__, str(exc), store=LOGS_STREAM) from exc
    return Transfer(name=label, sha256=hex_, size_bytes=src.size, chunks=sent.chunks,
                    sent_chunks=sent.chunks - sent.first, sent_bytes=sent.sent_bytes, resumed_at_chunk=sent.first)


class _FilteredConsumer:
    """An ephemeral push consumer on one filtered subject, delivering to this connection's inbox."""

    def __init__(self, js: JetStreamContext, subject: str) -> None:
        self.js, self.subject = js, subject
        self.sub: Subscription | None = None
        self.pending = 0

    async def start(self, *, start_seq: int | None = None, last_per_subject: bool = False) -> None:
        nc = natsadapter.client_of(self.js)  # the inbox must be under the credential's prefix
        inbox = nc.new_inbox()
        self.sub = await nc.subscribe(inbox)
        if last_per_subject:
            policy: dict[str, Any] = {"deliver_policy": DeliverPolicy.LAST_PER_SUBJECT}
        else:
            policy = {"deliver_policy": DeliverPolicy.BY_START_SEQUENCE, "opt_start_seq": max(start_seq or 1, 1)}
        config = ConsumerConfig(name=f"logs_{secrets.token_hex(8)}", filter_subject=self.subject,
                                deliver_subject=inbox, ack_policy=AckPolicy.NONE,
                                inactive_threshold=_CONSUMER_INACTIVE_S, mem_storage=True, num_replicas=1, **policy)
        try:
            info = await self.js.add_consumer(LOGS_STREAM, config=config)
        except BaseException:
            with anyio.CancelScope(shield=True):  # the inbox subscription goes even when we are being cancelled
                await self.stop()
            raise
        self.pending = int(info.num_pending or 0)

    async def stop(self) -> None:
        sub, self.sub = self.sub, None
        if sub is not None:
            await sub.unsubscribe()


class ConsumerChunkReader:
    """`mavjet.gateway.stores.chunks.ChunkReader` through a filtered consumer (per-subject permission suffices)."""

    def __init__(self, js: JetStreamContext, subject: str) -> None:
        self.consumer = _FilteredConsumer(js, subject)
        self.expect_seq = 0

    async def chunk_at(self, seq: int) -> Chunk:
        if self.consumer.sub is None or seq != self.expect_seq:
            await self.consumer.stop()
            await self.consumer.start(start_seq=seq)
        assert self.consumer.sub is not None
        msg = await self.consumer.sub.next_msg(timeout=_READ_TIMEOUT_S)
        stream_seq = int(msg.metadata.sequence.stream)
        self.expect_seq = stream_seq + 1
        return Chunk(seq=stream_seq, data=msg.data or b"", header=(msg.headers or {}).get(CHUNK_HEADER))

    async def close(self) -> None:
        await self.consumer.stop()


async def get_log(
    js: JetStreamContext, env: str, vid: str, name: str, dest: Path, *, progress: Progress | None = None,
) -> Transfer:  # fmt: skip
    """Download one stored log into `dest` (sha256 checked, resumable); raises BlobError."""
    record = await read_record(js, env, vid, name)
    if record is None:
        raise BlobError(object_name(vid, name), BlobFailure.NOT_FOUND, store=LOGS_STREAM)
    want = Wanted(label=record.object, key=record.sha256, digest=object_digest(record.sha256),
                  size_bytes=record.size_bytes, chunks=record.chunks, store=LOGS_STREAM)
    reader = ConsumerChunkReader(js, log_chunk_subject(env, vid, record.sha256))
    try:
        return await get_chunks(reader, want, dest, progress=progress)
    finally:
        await reader.close()


async def fetch_log(js: JetStreamContext, env: str, vid: str, name: str) -> bytes:
    """The whole log in memory (tests, small logs); raises BlobError."""
    with tempfile.TemporaryDirectory(prefix="mavjet-log-") as tmp:
        dest = Path(tmp) / name
        await get_log(js, env, vid, name, dest)
        return await anyio.Path(dest).read_bytes()


async def list_logs(js: JetStreamContext, env: str, vid: str = "*") -> list[LogRecord]:
    """Every log record of `vid` (or of every vehicle), by vehicle and name."""
    consumer = _FilteredConsumer(js, log_records_filter(env, vid))
    out: list[LogRecord] = []
    try:
        try:
            await consumer.start(last_per_subject=True)
        except NotFoundError:
            return []
        except Exception as exc:  # refused (no answer: a timeout), no stream, no connection: one clear error
            raise BlobError(f"logs/{vid}/", BlobFailure.UNREADABLE, type(exc).__name__,
                            str(exc) or "no answer (is this credential allowed to read these logs?)",
                            store=LOGS_STREAM) from exc
        assert consumer.sub is not None
        for _ in range(consumer.pending):
            try:
                msg = await consumer.sub.next_msg(timeout=_READ_TIMEOUT_S)
            except NatsTimeoutError:
                break
            try:
                out.append(LogRecord.from_json(json.loads(msg.data or b"{}")))
            except (KeyError, TypeError, ValueError):
                continue  # a record that is not ours is skipped, never fatal for the listing
    finally:
        await consumer.stop()
    return sorted(out, key=lambda r: (r.vid, r.log_id if r.log_id is not None else -1, r.name))
