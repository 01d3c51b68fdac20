"""The chunk layer: hash-addressed, resumable transfers of one content's bytes on a subject.

A content's chunks go to one subject (TWIN_BLOBS's `$O.TWIN_BLOBS.C.<hex>`, or a
vehicle's own `…logs.c.<hex>` in TWIN_LOGS), each carrying `Mavjet-Chunk: <index>
<offset> <chunk sha256>`. Because the subject is known before anything is sent,
the stream itself is the upload journal: a retry reads the last stored chunk and
continues after it, and `Nats-Expected-Last-Subject-Sequence` makes each chunk
append only where the previous one ended. A download keeps a local journal beside
its `.part` file and asks for the chunks after the last one written.

nats-py raises a wide range of exceptions on the way; this is the boundary that
translates them into `BlobError`, whose `kind` tells a caller whether trying again
later can help. The object store's records over these chunks are `blobs.py`'s;
flight logs use this layer on their own (gateway/stores/logstore.py).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Protocol

import anyio
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from mavjet.contract.errors import MavjetError
from mavjet.contract.subjects import BLOBS_BUCKET
from mavjet.gateway.publish.uplink import BulkPacer

CHUNK_HEADER = "Mavjet-Chunk"  # "<index> <offset> <sha256 hex of the chunk>"


DEFAULT_CHUNK_BYTES = 128 * 1024  # the object store's default; one JetStream message each


HASH_PREFIX = "sha256/"


def content_name(sha256_hex: str) -> str:
    return f"{HASH_PREFIX}{sha256_hex}"


def object_digest(sha256_hex: str) -> str:
    """The object store's digest field for that hash (`SHA-256=` + base64url)."""
    return "SHA-256=" + base64.urlsafe_b64encode(bytes.fromhex(sha256_hex)).decode()


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


def chunk_header(index: int, offset: int, data: bytes) -> str:
    return f"{index} {offset} {hashlib.sha256(data).hexdigest()}"


def parse_chunk_header(value: str | None) -> tuple[int, int, str] | None:
    parts = (value or "").split()
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit():
        return None
    return int(parts[0]), int(parts[1]), parts[2]


@contextmanager
def translated(name: str, kind: BlobFailure, store: str = BLOBS_BUCKET) -> Iterator[None]:
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
    with translated(label, BlobFailure.UNWRITABLE, where.store):
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
        with translated(label, BlobFailure.UNWRITABLE, where.store):
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
            with translated(name, BlobFailure.UNREADABLE, want.store):
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


def _discard(part: Path, journal: Path) -> None:
    part.unlink(missing_ok=True)
    journal.unlink(missing_ok=True)
