"""TWIN_BLOBS: plans for the daemon, and hash-addressed, resumable artifacts.

Commands (`mission_upload`) and the shadow (`desired.mission`) both name a
`.plan` object in TWIN_BLOBS. nats-py raises a wide range of exceptions on
the way (no connection, bucket or object missing, timeouts); this is the
boundary that translates them into `BlobError`, whose `kind` tells a caller
whether trying again later can help.

Artifacts (missions, later firmware or maps) are stored once per
content (docs/companion.md, "Artifacts"): the bytes live in the object
`sha256/<hex>` whose chunks are on the deterministic subject
`$O.TWIN_BLOBS.C.<hex>` (the object store's "nuid" is the hash), each chunk
carrying `Mavjet-Chunk: <index> <offset> <chunk sha256>`; a human name such
as `missions/survey.plan` is an object-store link to it. Because the chunk
subject is known before anything is sent, the stream itself is the upload
journal: a retry reads the last stored chunk and continues after it, and
`Nats-Expected-Last-Subject-Sequence` makes each chunk append only where the
previous one ended. A download keeps a local journal beside its `.part` file
and asks for the chunks after the last one written. Every reader of the
object store (nats-py, the `nats` CLI, `fetch_blob` below) can read these
objects, since they are ordinary object-store records.

The chunk layer (`put_chunks`, `get_chunks`) does not depend on the object
store: flight logs use it on their own per-vehicle subjects in TWIN_LOGS
(gateway/stores/logstore.py), where a vehicle's credential can be scoped to them.

Length: about 510 lines, over the project's ~400: the chunk layer and the object
store records it writes share one journal format, kept in one module; splitting
`put_chunks`/`get_chunks` into their own module is the next step when it grows.
"""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

import anyio
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from mavjet.contract.errors import MavjetError
from mavjet.contract.subjects import BLOBS_BUCKET
from mavjet.drivers.mavlink.plan import Plan, parse_plan
from mavjet.gateway.publish.uplink import BulkPacer

STREAM = f"OBJ_{BLOBS_BUCKET}"
HASH_PREFIX = "sha256/"
CHUNK_HEADER = "Mavjet-Chunk"  # "<index> <offset> <sha256 hex of the chunk>"
SHA_HEADER = "Mavjet-Sha256"  # on a content record and on a link: the content's hash
DEFAULT_CHUNK_BYTES = 128 * 1024  # the object store's default; one JetStream message each


class BlobFailure(StrEnum):
    NOT_CONNECTED = "not_connected"  # no NATS connection: try again later
    NOT_FOUND = "not_found"  # the bucket or the object does not exist
    UNREADABLE = "unreadable"  # any other failure reading it (timeout, server error): try again later
    UNWRITABLE = "unwritable"  # a failure storing it: try again later, the upload resumes
    CORRUPT = "corrupt"  # stored bytes do not match their sha256: trying again does not help


class BlobError(MavjetError):
    """An object could not be read from TWIN_BLOBS; `error` and `detail` describe the cause."""

    def __init__(self, name: str, kind: BlobFailure, error: str = "", detail: str = "", *,
                 store: str = BLOBS_BUCKET) -> None:
        super().__init__(f"{store} {name!r}: {kind.value} {error} {detail}".strip())
        self.name = name
        self.kind = kind
        self.error = error  # the underlying exception's type name ("" for NOT_CONNECTED)
        self.detail = detail  # its message


async def fetch_blob(js: JetStreamContext | None, name: str) -> bytes:
    """The object's bytes (a link is followed, the digest checked); raises BlobError."""
    if js is None:
        raise BlobError(name, BlobFailure.NOT_CONNECTED)
    try:
        store = await js.object_store(BLOBS_BUCKET)
        obj = await store.get(name)
    except Exception as exc:  # nats-py raises a wide range here; translated at this boundary
        kind = BlobFailure.NOT_FOUND if isinstance(exc, NotFoundError) else BlobFailure.UNREADABLE
        raise BlobError(name, kind, type(exc).__name__, str(exc)) from exc
    return obj.data or b""


async def fetch_plan(js: JetStreamContext | None, name: str) -> Plan:
    """The parsed `.plan` object; raises BlobError, or PlanError when it is not a valid plan."""
    return parse_plan(await fetch_blob(js, name))


# --- hash-addressed, resumable transfers -------------------------------------------------


class Progress(Protocol):
    def __call__(self, done_bytes: int, total_bytes: int) -> None: ...


@dataclass(frozen=True, kw_only=True)
class Transfer:
    """What one put or get did: `sent_*` counts only chunks that crossed the wire this time."""

    name: str  # the content object, sha256/<hex>
    sha256: str
    size_bytes: int
    chunks: int
    sent_chunks: int
    sent_bytes: int
    resumed_at_chunk: int  # 0 for a fresh transfer
    already_present: bool = False


def content_name(sha256_hex: str) -> str:
    return f"{HASH_PREFIX}{sha256_hex}"


def chunk_subject(nuid: str) -> str:
    return f"$O.{BLOBS_BUCKET}.C.{nuid}"


def meta_subject(name: str) -> str:
    return f"$O.{BLOBS_BUCKET}.M.{base64.urlsafe_b64encode(name.encode()).decode()}"


def object_digest(sha256_hex: str) -> str:
    """The object store's digest field for that hash (`SHA-256=` + base64url)."""
    return "SHA-256=" + base64.urlsafe_b64encode(bytes.fromhex(sha256_hex)).decode()


def chunk_header(index: int, offset: int, data: bytes) -> str:
    return f"{index} {offset} {hashlib.sha256(data).hexdigest()}"


def parse_chunk_header(value: str | None) -> tuple[int, int, str] | None:
    parts = (value or "").split()
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit():
        return None
    return int(parts[0]), int(parts[1]), parts[2]


def _now() -> str:
    return datetime.now(UTC).isoformat()


async def info(js: JetStreamContext, name: str) -> dict[str, Any] | None:
    """The object-store record of `name` as JSON, or None when absent or deleted."""
    try:
        msg = await js.get_last_msg(STREAM, meta_subject(name))
    except NotFoundError:
        return None
    doc: dict[str, Any] = json.loads(msg.data or b"{}")
    return None if doc.get("deleted") else doc


async def resolve(js: JetStreamContext, name: str) -> dict[str, Any] | None:
    """The content record behind `name`, following one link."""
    doc = await info(js, name)
    link = ((doc or {}).get("options") or {}).get("link")
    if doc is not None and link and link.get("name"):
        return await info(js, link["name"])
    return doc


async def _publish_record(js: JetStreamContext, doc: dict[str, Any]) -> None:
    # Rollup: only the newest record per name is kept, as the object store does.
    await js.publish(meta_subject(doc["name"]), json.dumps(doc).encode(), headers={"Nats-Rollup": "sub"})


async def link(js: JetStreamContext, alias: str, target: dict[str, Any]) -> None:
    """Point `alias` at a content record; purge the chunks of a plain object it replaces."""
    old = await info(js, alias)
    hex_ = target["name"].removeprefix(HASH_PREFIX)
    await _publish_record(js, {
        "name": alias, "bucket": BLOBS_BUCKET,
        # A fresh nuid, never the hash: a plain `put` over this name later purges
        # the chunks of the old nuid, and must not purge the shared content.
        "nuid": uuid.uuid4().hex, "mtime": _now(), "size": target.get("size", 0),
        "headers": {SHA_HEADER: [hex_]},
        "options": {"link": {"bucket": BLOBS_BUCKET, "name": target["name"]}},
    })  # fmt: skip
    if old is not None and not (old.get("options") or {}).get("link") and old.get("nuid") != hex_:
        await js.purge_stream(STREAM, subject=chunk_subject(old["nuid"]))


@contextmanager
def _translated(name: str, kind: BlobFailure, store: str = BLOBS_BUCKET) -> Iterator[None]:
    """nats-py raises a wide range of exceptions; translated into BlobError at this boundary."""
    try:
        yield
    except BlobError:
        raise
    except Exception as exc:
        kind = BlobFailure.NOT_FOUND if isinstance(exc, NotFoundError) and kind is BlobFailure.UNREADABLE else kind
        raise BlobError(name, kind, type(exc).__name__, str(exc), store=store) from exc


class Source:
    """The bytes to upload: in memory, or a file read a chunk at a time (a flight log need not fit in RAM).

    A file must not change while it is uploaded: the chunks would not add up to
    the hash taken first, and every reader would refuse the object as corrupt.
    """

    def __init__(self, data: bytes | Path) -> None:
        self.data = data
        self.size = len(data) if isinstance(data, bytes) else data.stat().st_size

    async def read(self, offset: int, n: int) -> bytes:
        if isinstance(self.data, bytes):
            return self.data[offset : offset + n]
        path = self.data

        def read() -> bytes:
            with path.open("rb") as f:
                f.seek(offset)
                return f.read(n)

        return await anyio.to_thread.run_sync(read)

    async def sha256(self) -> str:
        if isinstance(self.data, bytes):
            return hashlib.sha256(self.data).hexdigest()
        path = self.data

        def digest() -> str:
            h = hashlib.sha256()
            with path.open("rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            return h.hexdigest()

        return await anyio.to_thread.run_sync(digest)


@dataclass(frozen=True, kw_only=True)
class Chunks:
    """Where one content's chunks live: TWIN_BLOBS's `$O...C.<hex>`, or a vehicle's `...logs.c.<hex>` in TWIN_LOGS.

    `scoped` says the writer holds a per-subject credential (a vehicle writing its
    own logs): it may not read stream info (that names every subject) nor purge,
    so the journal is read with a direct get of the subject's last chunk alone.
    """

    stream: str
    subject: str
    scoped: bool = False
    store: str = BLOBS_BUCKET  # what errors name


async def _resume_point(js: JetStreamContext, where: Chunks, src: Source) -> tuple[int, int, int]:
    """(next chunk index, next offset, last stream sequence on the subject; 0 when empty).

    The stream is the journal: the last stored chunk names its index and offset,
    and its bytes are checked against ours. Anything inconsistent (a chunk of
    other bytes, a count that does not match the index) is purged and the
    upload starts over, which is always correct, only slower. A scoped writer
    cannot purge: it refuses with CORRUPT, for an administrator to purge.
    """
    count: int | None = None
    try:
        if where.scoped:
            last = await js.get_last_msg(where.stream, where.subject, direct=True)
        else:
            state = await js.stream_info(where.stream, subjects_filter=where.subject)
            count = (state.state.subjects or {}).get(where.subject, 0)
            if count == 0:
                return 0, 0, 0
            last = await js.get_last_msg(where.stream, where.subject)
    except NotFoundError:
        return 0, 0, 0
    parsed = parse_chunk_header((last.headers or {}).get(CHUNK_HEADER))
    body = last.data or b""
    if parsed is not None:
        index, offset, sha = parsed
        mine = await src.read(offset, len(body))
        if (count is None or index == count - 1) and hashlib.sha256(mine).hexdigest() == sha == hashlib.sha256(
                body).hexdigest():
            return index + 1, offset + len(body), last.seq or 0
    if where.scoped:
        raise BlobError(where.subject, BlobFailure.CORRUPT, "ChunkMismatch",
                        f"the last chunk on {where.subject} is not these bytes: an administrator must purge it",
                        store=where.store)
    await js.purge_stream(where.stream, subject=where.subject)
    return 0, 0, 0


@dataclass(frozen=True, kw_only=True)
class Sent:
    chunks: int  # the content's chunks, all stored now
    first: int  # the chunk this upload started at (0 unless resumed)
    sent_bytes: int


async def put_chunks(
    js: JetStreamContext, where: Chunks, src: Source, sha256_hex: str, *, label: str,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES, progress: Progress | None = None, pacer: BulkPacer | None = None,
) -> Sent:  # fmt: skip
    """Append `src`'s chunks to `where.subject`, resuming after the last one stored; raises BlobError.

    Shared by TWIN_BLOBS (`put_blob`) and TWIN_LOGS (gateway/stores/logstore.py): each
    chunk carries `Mavjet-Chunk: <index> <offset> <sha256>`, is de-duplicated by
    `Nats-Msg-Id` and appended only where the previous one ended.
    """
    size = src.size
    with _translated(label, BlobFailure.UNWRITABLE, where.store):
        index, offset, last_seq = await _resume_point(js, where, src)
    first, sent_bytes = index, 0
    if progress:
        progress(offset, size)
    off, n = offset, 0
    while off < size:
        # A thin uplink (gateway/publish/uplink.py): chunks sized to it, sent when higher priorities are not waiting.
        n = min(size - off, chunk_bytes if pacer is None else pacer.bulk_chunk_bytes(chunk_bytes, n))
        if pacer is not None:
            await pacer.before_bulk(n)
        body = await src.read(off, n)
        with _translated(label, BlobFailure.UNWRITABLE, where.store):
            ack = await js.publish(where.subject, body, stream=where.stream, headers={
                "Nats-Msg-Id": f"{sha256_hex}.{index}",
                "Nats-Expected-Last-Subject-Sequence": str(last_seq),
                CHUNK_HEADER: chunk_header(index, off, body),
            })  # fmt: skip
        last_seq, index, sent_bytes = ack.seq, index + 1, sent_bytes + n
        # A progress callback may raise to abort (a CLI's Ctrl-C, a test's cut):
        # that propagates untranslated, and the next put resumes here.
        off += n
        if progress:
            progress(off, size)
    return Sent(chunks=index, first=first, sent_bytes=sent_bytes)


async def put_blob(
    js: JetStreamContext, data: bytes | Path, *, alias: str | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES, progress: Progress | None = None,
) -> Transfer:  # fmt: skip
    """Store `data` (bytes, or a file) as `sha256/<hex>` once, resuming a cut upload; link `alias` to it."""
    src = Source(data)
    size = src.size
    hex_ = await src.sha256()
    name = content_name(hex_)
    with _translated(alias or name, BlobFailure.UNWRITABLE):
        existing = await info(js, name)
        if existing is not None and existing.get("digest") == object_digest(hex_):
            if alias:
                await link(js, alias, existing)
        else:
            existing = None
    if existing is not None:
        if progress:
            progress(size, size)
        chunks = int(existing.get("chunks") or 0)
        return Transfer(name=name, sha256=hex_, size_bytes=size, chunks=chunks,
                        sent_chunks=0, sent_bytes=0, resumed_at_chunk=chunks, already_present=True)
    sent = await put_chunks(js, Chunks(stream=STREAM, subject=chunk_subject(hex_)), src, hex_,
                            label=alias or name, chunk_bytes=chunk_bytes, progress=progress)
    record = {
        "name": name, "bucket": BLOBS_BUCKET, "nuid": hex_, "size": size, "chunks": sent.chunks,
        "digest": object_digest(hex_), "mtime": _now(), "headers": {SHA_HEADER: [hex_]},
        "options": {"max_chunk_size": chunk_bytes},
    }  # fmt: skip
    with _translated(alias or name, BlobFailure.UNWRITABLE):
        await _publish_record(js, record)
        if alias:
            await link(js, alias, record)
    return Transfer(name=name, sha256=hex_, size_bytes=size, chunks=sent.chunks,
                    sent_chunks=sent.chunks - sent.first, sent_bytes=sent.sent_bytes, resumed_at_chunk=sent.first)


def _journal_path(dest: Path) -> Path:
    return dest.with_name(dest.name + ".part.json")


def _part_path(dest: Path) -> Path:
    return dest.with_name(dest.name + ".part")


def _read_journal(dest: Path, nuid: str, digest: str) -> tuple[int, int, int]:
    """(chunks written, bytes written, next stream sequence) of a matching earlier download."""
    try:
        doc = json.loads(_journal_path(dest).read_text())
        part_bytes = _part_path(dest).stat().st_size
    except (OSError, ValueError):
        return 0, 0, 1
    if doc.get("nuid") != nuid or doc.get("digest") != digest or part_bytes < doc.get("bytes", 0):
        return 0, 0, 1
    return int(doc["chunks"]), int(doc["bytes"]), int(doc["next_seq"])


@dataclass(frozen=True, kw_only=True)
class Chunk:
    seq: int
    data: bytes
    header: str | None  # Mavjet-Chunk, when the uploader wrote one


class ChunkReader(Protocol):
    """The first chunk at or after stream sequence `seq` (a direct get, or a filtered consumer)."""

    async def chunk_at(self, seq: int) -> Chunk: ...


@dataclass(frozen=True)
class StreamGetReader:
    """Chunks by `next_by_subj` gets: for credentials that may read the whole stream."""

    js: JetStreamContext
    stream: str
    subject: str

    async def chunk_at(self, seq: int) -> Chunk:
        msg = await self.js.get_msg(self.stream, seq=seq, subject=self.subject, next=True)
        return Chunk(seq=msg.seq or seq, data=msg.data or b"", header=(msg.headers or {}).get(CHUNK_HEADER))


@dataclass(frozen=True, kw_only=True)
class Wanted:
    """What a download expects: from the object-store record, or a TWIN_LOGS name record."""

    label: str  # for errors
    key: str  # what the local journal must match (the nuid; a log's sha256)
    digest: str  # object_digest of the whole content
    size_bytes: int
    chunks: int
    store: str = BLOBS_BUCKET  # what errors name


async def get_chunks(reader: ChunkReader, want: Wanted, dest: Path, *, progress: Progress | None = None) -> Transfer:
    """Download `want`'s chunks into `dest`, resuming a cut download; raises BlobError.

    The bytes go to `dest.part`; after each chunk `dest.part.json` records how
    far it got and the stream sequence to ask for next. Each chunk's own sha256
    (when the uploader wrote one) is checked as it arrives, the whole content's
    before `dest` appears.
    """
    name, size, chunks = want.label, want.size_bytes, want.chunks
    done_chunks, done_bytes, next_seq = _read_journal(dest, want.key, want.digest)
    part, journal = _part_path(dest), _journal_path(dest)
    first, sent_bytes = done_chunks, 0
    h = hashlib.sha256()

    def prepare() -> None:
        with part.open("ab") as f:
            f.truncate(done_bytes)
        with part.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)

    await anyio.to_thread.run_sync(prepare)
    if progress:
        progress(done_bytes, size)
    with part.open("ab") as out:
        while done_chunks < chunks:
            with _translated(name, BlobFailure.UNREADABLE, want.store):
                msg = await reader.chunk_at(next_seq)
            body = msg.data
            parsed = parse_chunk_header(msg.header)
            if parsed is not None and (parsed[0] != done_chunks or parsed[2] != hashlib.sha256(body).hexdigest()):
                _discard(part, journal)
                raise BlobError(name, BlobFailure.CORRUPT, "ChunkMismatch", f"chunk {done_chunks} (seq {msg.seq})",
                                store=want.store)
            out.write(body)
            out.flush()
            h.update(body)
            done_chunks, done_bytes, sent_bytes = done_chunks + 1, done_bytes + len(body), sent_bytes + len(body)
            next_seq = msg.seq + 1
            journal.write_text(json.dumps({"nuid": want.key, "digest": want.digest, "chunks": done_chunks,
                                           "bytes": done_bytes, "next_seq": next_seq}))
            if progress:
                progress(done_bytes, size)
    hex_ = h.hexdigest()
    if object_digest(hex_) != want.digest or done_bytes != size:
        _discard(part, journal)
        raise BlobError(name, BlobFailure.CORRUPT, "DigestMismatch", f"got sha256 {hex_}, {done_bytes} bytes",
                        store=want.store)
    part.replace(dest)
    journal.unlink(missing_ok=True)
    return Transfer(name=content_name(hex_), sha256=hex_, size_bytes=size, chunks=chunks,
                    sent_chunks=chunks - first, sent_bytes=sent_bytes, resumed_at_chunk=first)


async def get_blob(
    js: JetStreamContext, name: str, dest: Path, *, progress: Progress | None = None,
) -> Transfer:  # fmt: skip
    """Download `name` (a link is followed) into `dest`, resuming a cut download; raises BlobError."""
    with _translated(name, BlobFailure.UNREADABLE):
        record = await resolve(js, name)
    if record is None:
        raise BlobError(name, BlobFailure.NOT_FOUND)
    nuid = str(record["nuid"])
    want = Wanted(label=name, key=nuid, digest=str(record.get("digest") or ""),
                  size_bytes=int(record.get("size") or 0), chunks=int(record.get("chunks") or 0))
    return await get_chunks(StreamGetReader(js, STREAM, chunk_subject(nuid)), want, dest, progress=progress)


def _discard(part: Path, journal: Path) -> None:
    part.unlink(missing_ok=True)
    journal.unlink(missing_ok=True)


async def list_records(js: JetStreamContext, prefix: str = "") -> list[dict[str, Any]]:
    """Every live record (content and links) whose name starts with `prefix`, by name."""
    try:
        store = await js.object_store(BLOBS_BUCKET)
        infos = await store.list(ignore_deletes=True)
    except NotFoundError:
        return []
    docs = [i.as_dict() for i in infos if i.name.startswith(prefix)]
    return sorted(docs, key=lambda d: str(d["name"]))
