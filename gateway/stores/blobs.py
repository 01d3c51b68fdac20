"""TWIN_BLOBS: plans for the daemon, and hash-addressed, resumable artifacts.

Commands (`mission_upload`) and the shadow (`desired.mission`) both name a
`.plan` object in TWIN_BLOBS (`fetch_plan`).

Artifacts (missions, later firmware or maps) are stored once per content
(docs/companion.md, "Artifacts"): the bytes live in the object `sha256/<hex>`
whose chunks are on the deterministic subject `$O.TWIN_BLOBS.C.<hex>` (the
object store's "nuid" is the hash; the chunk layer is `chunks.py`); a human name
such as `missions/survey.plan` is an object-store link to it. Every reader of the
object store (nats-py, the `nats` CLI, `fetch_blob` below) can read these
objects, since they are ordinary object-store records.
"""

from __future__ import annotations

import base64
import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from mavjet.contract.subjects import BLOBS_BUCKET
from mavjet.drivers.mavlink.plan import Plan, parse_plan
from mavjet.gateway.stores.chunks import (
    DEFAULT_CHUNK_BYTES,
    HASH_PREFIX,
    BlobError,
    BlobFailure,
    Chunks,
    Progress,
    Source,
    StreamGetReader,
    Transfer,
    Wanted,
    content_name,
    get_chunks,
    object_digest,
    put_chunks,
    translated,
)

STREAM = f"OBJ_{BLOBS_BUCKET}"




SHA_HEADER = "Mavjet-Sha256"  # on a content record and on a link: the content's hash


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


def chunk_subject(nuid: str) -> str:
    return f"$O.{BLOBS_BUCKET}.C.{nuid}"


def meta_subject(name: str) -> str:
    return f"$O.{BLOBS_BUCKET}.M.{base64.urlsafe_b64encode(name.encode()).decode()}"


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


async def put_blob(
    js: JetStreamContext, data: bytes | Path, *, alias: str | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES, progress: Progress | None = None,
) -> Transfer:  # fmt: skip
    """Store `data` (bytes, or a file) as `sha256/<hex>` once, resuming a cut upload; link `alias` to it."""
    src = Source(data)
    size = src.size
    hex_ = await src.sha256()
    name = content_name(hex_)
    with translated(alias or name, BlobFailure.UNWRITABLE):
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
    with translated(alias or name, BlobFailure.UNWRITABLE):
        await _publish_record(js, record)
        if alias:
            await link(js, alias, record)
    return Transfer(name=name, sha256=hex_, size_bytes=size, chunks=sent.chunks,
                    sent_chunks=sent.chunks - sent.first, sent_bytes=sent.sent_bytes, resumed_at_chunk=sent.first)


async def get_blob(
    js: JetStreamContext, name: str, dest: Path, *, progress: Progress | None = None,
) -> Transfer:  # fmt: skip
    """Download `name` (a link is followed) into `dest`, resuming a cut download; raises BlobError."""
    with translated(name, BlobFailure.UNREADABLE):
        record = await resolve(js, name)
    if record is None:
        raise BlobError(name, BlobFailure.NOT_FOUND)
    nuid = str(record["nuid"])
    want = Wanted(label=name, key=nuid, digest=str(record.get("digest") or ""),
                  size_bytes=int(record.get("size") or 0), chunks=int(record.get("chunks") or 0))
    return await get_chunks(StreamGetReader(js, STREAM, chunk_subject(nuid)), want, dest, progress=progress)


async def list_records(js: JetStreamContext, prefix: str = "") -> list[dict[str, Any]]:
    """Every live record (content and links) whose name starts with `prefix`, by name."""
    try:
        store = await js.object_store(BLOBS_BUCKET)
        infos = await store.list(ignore_deletes=True)
    except NotFoundError:
        return []
    docs = [i.as_dict() for i in infos if i.name.startswith(prefix)]
    return sorted(docs, key=lambda d: str(d["name"]))
