"""Hash-addressed, resumable artifacts in TWIN_BLOBS, against a real nats-server.

What crosses the wire is counted by a second connection subscribed to the
bucket's chunk subjects (`$O.TWIN_BLOBS.C.>`), independently of the client's
own figures (the rig: tests/support/transfer.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client

from mavjet.contract.natsconn import open_client
from mavjet.gateway.stores import blobs
from mavjet.gateway.stores.blobs import chunk_subject, fetch_blob, get_blob, put_blob
from mavjet.gateway.stores.chunks import BlobError, BlobFailure
from mavjet.ops.natsserver import NatsServer
from tests.support.transfer import CHUNK, Cut, Wire, corrupt_chunk, cut_after, settle, wire_spy

DATA = os.urandom(CHUNK * 10 + 123)  # 11 chunks, the last one short
HEX = hashlib.sha256(DATA).hexdigest()


@pytest.fixture
async def wire(provisioned: Client, nats_server: NatsServer) -> AsyncIterator[Wire]:
    async with wire_spy(nats_server.url, "$O.TWIN_BLOBS.C.>") as w:
        yield w


async def test_put_twice_sends_once(provisioned: Client, wire: Wire) -> None:
    js = provisioned.jetstream()
    first = await put_blob(js, DATA, alias="missions/a.plan", chunk_bytes=CHUNK)
    await settle(provisioned)
    assert (first.chunks, first.sent_chunks, first.sha256) == (11, 11, HEX)
    assert (wire.msgs, wire.bytes) == (11, len(DATA))
    again = await put_blob(js, DATA, alias="missions/b.plan", chunk_bytes=CHUNK)
    await settle(provisioned)
    assert again.already_present and again.sent_chunks == 0 and again.sent_bytes == 0
    assert (wire.msgs, wire.bytes) == (11, len(DATA)), "the second put sent chunks"
    # Both names read through the object store's own reader (links followed, digest checked).
    assert await fetch_blob(js, "missions/a.plan") == DATA
    assert await fetch_blob(js, "missions/b.plan") == DATA
    assert await fetch_blob(js, f"sha256/{HEX}") == DATA
    names = [d["name"] for d in await blobs.list_records(js)]
    assert names == ["missions/a.plan", "missions/b.plan", f"sha256/{HEX}"]


async def test_interrupted_upload_resumes_from_the_last_stored_chunk(provisioned: Client, wire: Wire) -> None:
    js = provisioned.jetstream()
    with pytest.raises(Cut):
        await put_blob(js, DATA, alias="logs/VID-001/1.bin", chunk_bytes=CHUNK, progress=cut_after(4))
    await settle(provisioned)
    assert wire.msgs == 4
    assert await blobs.info(js, f"sha256/{HEX}") is None  # not visible until complete
    done = await put_blob(js, DATA, alias="logs/VID-001/1.bin", chunk_bytes=CHUNK)
    await settle(provisioned)
    assert (done.resumed_at_chunk, done.sent_chunks, done.sent_bytes) == (4, 7, len(DATA) - 4 * CHUNK)
    assert (wire.msgs, wire.bytes) == (11, len(DATA)), "only the missing chunks were sent"
    state = await js.stream_info(blobs.STREAM, subjects_filter=chunk_subject(HEX))
    assert state.state.subjects == {chunk_subject(HEX): 11}  # no chunk stored twice
    assert await fetch_blob(js, "logs/VID-001/1.bin") == DATA


async def test_a_file_uploads_in_chunks_and_resumes_across_sources(provisioned: Client, wire: Wire,
                                                                   tmp_path: Path) -> None:
    """A file is read a chunk at a time; the resume point is the stream's, whoever uploads."""
    f = tmp_path / "00000007.BIN"
    f.write_bytes(DATA)
    js = provisioned.jetstream()
    with pytest.raises(Cut):
        await put_blob(js, f, chunk_bytes=CHUNK, progress=cut_after(2))
    done = await put_blob(js, DATA, chunk_bytes=CHUNK)  # another uploader, same bytes
    await settle(provisioned)
    assert (done.resumed_at_chunk, done.sent_chunks, wire.msgs) == (2, 9, 11)
    assert await fetch_blob(js, f"sha256/{HEX}") == DATA


async def test_upload_killed_by_a_closed_connection_resumes(provisioned: Client, nats_server: NatsServer,
                                                            wire: Wire) -> None:
    victim = await open_client(nats_server.url, connect_timeout=2, allow_reconnect=False)
    closing: list[asyncio.Task[None]] = []

    def close_after_3(done_bytes: int, total_bytes: int) -> None:
        if done_bytes >= 3 * CHUNK and not closing:
            closing.append(asyncio.ensure_future(victim.close()))

    with pytest.raises(BlobError) as err:
        await put_blob(victim.jetstream(), DATA, chunk_bytes=CHUNK, progress=close_after_3)
    assert err.value.kind is BlobFailure.UNWRITABLE
    await asyncio.gather(*closing)
    await settle(provisioned)
    stored = wire.msgs
    assert 3 <= stored < 11
    done = await put_blob(provisioned.jetstream(), DATA, chunk_bytes=CHUNK)
    await settle(provisioned)
    assert done.resumed_at_chunk == stored and done.sent_chunks == 11 - stored
    assert wire.msgs == 11


async def test_interrupted_download_resumes_and_is_byte_identical(provisioned: Client, tmp_path: Path) -> None:
    js = provisioned.jetstream()
    await put_blob(js, DATA, alias="maps/field.bin", chunk_bytes=CHUNK)
    dest = tmp_path / "field.bin"
    with pytest.raises(Cut):
        await get_blob(js, "maps/field.bin", dest, progress=cut_after(6))
    assert not dest.exists() and (tmp_path / "field.bin.part").stat().st_size == 6 * CHUNK
    done = await get_blob(js, "maps/field.bin", dest)
    assert (done.resumed_at_chunk, done.sent_chunks, done.sent_bytes) == (6, 5, len(DATA) - 6 * CHUNK)
    assert dest.read_bytes() == DATA and hashlib.sha256(dest.read_bytes()).hexdigest() == HEX == done.sha256
    assert not (tmp_path / "field.bin.part").exists() and not (tmp_path / "field.bin.part.json").exists()


async def test_a_plain_object_store_object_downloads_too(provisioned: Client, tmp_path: Path) -> None:
    js = provisioned.jetstream()
    store = await js.object_store("TWIN_BLOBS")
    await store.put("firmware/plain.bin", DATA)
    done = await get_blob(js, "firmware/plain.bin", tmp_path / "plain.bin")
    assert (tmp_path / "plain.bin").read_bytes() == DATA and done.sha256 == HEX


async def test_a_corrupted_chunk_is_detected(provisioned: Client, tmp_path: Path) -> None:
    js = provisioned.jetstream()
    await put_blob(js, DATA, alias="maps/bad.bin", chunk_bytes=CHUNK)
    await corrupt_chunk(js, blobs.STREAM, chunk_subject(HEX), chunks=11, index=3)
    with pytest.raises(BlobError) as err:
        await get_blob(js, "maps/bad.bin", tmp_path / "bad.bin")
    assert err.value.kind is BlobFailure.CORRUPT and "chunk 3" in err.value.detail
    assert not (tmp_path / "bad.bin").exists() and not (tmp_path / "bad.bin.part").exists()
    # The object store's own reader refuses it too (whole-object digest).
    with pytest.raises(BlobError):
        await fetch_blob(js, "maps/bad.bin")
