"""TWIN_LOGS: flight logs under the vehicle's own subjects, resumable at chunk level, against a real nats-server.

The chunk code is TWIN_BLOBS's (`gateway.blobs.put_chunks` / `get_chunks`);
these tests show it holds for the per-vehicle subjects, with the journal read
by a direct get of the last chunk (what a scoped vehicle credential may do)
and chunks read through a filtered consumer. What crosses the wire is counted
by a second connection subscribed to the logs subjects.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from gateway import logstore
from gateway.blobs import BlobError, BlobFailure, Progress
from gateway.contract.subjects import LOGS_STREAM, log_chunk_subject, log_record_subject
from gateway.ops.natsserver import NatsServer

ENV = "test"
CHUNK = 4096
DATA = os.urandom(CHUNK * 10 + 123)  # 11 chunks, the last one short
HEX = hashlib.sha256(DATA).hexdigest()
NAME = "7-20261123T101010Z.bin"


class Cut(Exception):
    """A link that drops in the middle of a transfer."""


class Wire:
    def __init__(self) -> None:
        self.chunks = 0
        self.bytes = 0

    async def cb(self, msg: Msg) -> None:
        if ".logs.c." in msg.subject:
            self.chunks += 1
            self.bytes += len(msg.data)


@pytest.fixture
async def wire(provisioned: Client, nats_server: NatsServer) -> AsyncIterator[Wire]:
    spy = await nats.connect(nats_server.url, connect_timeout=2)
    w = Wire()
    await spy.subscribe(f"fleet.{ENV}.veh.*.logs.>", cb=w.cb)
    await spy.flush()
    try:
        yield w
    finally:
        await spy.close()


async def settle(nc: Client) -> None:
    await nc.flush()
    await asyncio.sleep(0.2)


def cut_after(chunks: int) -> Progress:
    def progress(done_bytes: int, total_bytes: int) -> None:
        if chunks * CHUNK <= done_bytes < total_bytes:
            raise Cut
    return progress


async def test_interrupted_upload_resumes_at_the_last_stored_chunk(provisioned: Client, wire: Wire) -> None:
    js = provisioned.jetstream()
    with pytest.raises(Cut):
        await logstore.put_log(js, ENV, "VID-001", NAME, DATA, log_id=7, chunk_bytes=CHUNK, progress=cut_after(4))
    await settle(provisioned)
    assert wire.chunks == 4
    assert await logstore.read_record(js, ENV, "VID-001", NAME) is None  # not listed until complete
    done = await logstore.put_log(js, ENV, "VID-001", NAME, DATA, log_id=7, chunk_bytes=CHUNK)
    await settle(provisioned)
    assert (done.resumed_at_chunk, done.sent_chunks, done.sent_bytes) == (4, 7, len(DATA) - 4 * CHUNK)
    assert (wire.chunks, wire.bytes) == (11, len(DATA)), "only the missing chunks were sent"
    state = await js.stream_info(LOGS_STREAM, subjects_filter=log_chunk_subject(ENV, "VID-001", HEX))
    assert state.state.subjects == {log_chunk_subject(ENV, "VID-001", HEX): 11}
    again = await logstore.put_log(js, ENV, "VID-001", NAME, DATA, log_id=7, chunk_bytes=CHUNK)
    assert again.already_present and again.sent_bytes == 0
    rec = await logstore.read_record(js, ENV, "VID-001", NAME)
    assert rec is not None and (rec.sha256, rec.size_bytes, rec.chunks, rec.log_id) == (HEX, len(DATA), 11, 7)
    assert rec.object == f"logs/VID-001/{NAME}"


async def test_interrupted_download_resumes_and_is_byte_identical(provisioned: Client, tmp_path: Path) -> None:
    js = provisioned.jetstream()
    await logstore.put_log(js, ENV, "VID-001", NAME, DATA, chunk_bytes=CHUNK)
    dest = tmp_path / "log.bin"
    with pytest.raises(Cut):
        await logstore.get_log(js, ENV, "VID-001", NAME, dest, progress=cut_after(6))
    assert not dest.exists() and (tmp_path / "log.bin.part").stat().st_size == 6 * CHUNK
    done = await logstore.get_log(js, ENV, "VID-001", NAME, dest)
    assert (done.resumed_at_chunk, done.sent_chunks, done.sent_bytes) == (6, 5, len(DATA) - 6 * CHUNK)
    assert dest.read_bytes() == DATA and done.sha256 == HEX
    assert await logstore.fetch_log(js, ENV, "VID-001", NAME) == DATA


async def test_listing_is_per_vehicle_and_newest_record_wins(provisioned: Client, tmp_path: Path) -> None:
    js = provisioned.jetstream()
    await logstore.put_log(js, ENV, "VID-002", "1-undated.bin", b"a" * 100, log_id=1)
    await logstore.put_log(js, ENV, "VID-001", "2-undated.bin", b"b" * 100, log_id=2)
    await logstore.put_log(js, ENV, "VID-001", "1-undated.bin", b"c" * 100, log_id=1)
    await logstore.put_log(js, ENV, "VID-001", "1-undated.bin", b"d" * 200, log_id=1)  # replaced
    mine = await logstore.list_logs(js, ENV, "VID-001")
    assert [(r.log_id, r.size_bytes) for r in mine] == [(1, 200), (2, 100)]
    assert [r.vid for r in await logstore.list_logs(js, ENV)] == ["VID-001", "VID-001", "VID-002"]
    assert await logstore.list_logs(js, ENV, "VID-009") == []
    with pytest.raises(BlobError) as err:
        await logstore.get_log(js, ENV, "VID-009", NAME, tmp_path / "none.bin")
    assert err.value.kind is BlobFailure.NOT_FOUND and "TWIN_LOGS" in str(err.value)


async def test_a_corrupted_chunk_is_detected(provisioned: Client, tmp_path: Path) -> None:
    js = provisioned.jetstream()
    await logstore.put_log(js, ENV, "VID-001", NAME, DATA, chunk_bytes=CHUNK)
    subj = log_chunk_subject(ENV, "VID-001", HEX)
    stored, seq = [], 1
    for _ in range(11):
        m = await js.get_msg(LOGS_STREAM, seq=seq, subject=subj, next=True)
        stored.append((m.data or b"", dict(m.headers or {})))
        seq = (m.seq or 0) + 1
    await js.purge_stream(LOGS_STREAM, subject=subj)
    for i, (body, headers) in enumerate(stored):
        if i == 3:
            body = body[:10] + bytes([body[10] ^ 0xFF]) + body[11:]
        headers.pop("Nats-Expected-Last-Subject-Sequence", None)
        headers.pop("Nats-Msg-Id", None)
        await js.publish(subj, body, headers=headers)
    with pytest.raises(BlobError) as err:
        await logstore.get_log(js, ENV, "VID-001", NAME, tmp_path / "bad.bin")
    assert err.value.kind is BlobFailure.CORRUPT and "chunk 3" in err.value.detail
    assert not (tmp_path / "bad.bin").exists() and not (tmp_path / "bad.bin.part").exists()


def test_log_names_must_be_subject_tokens() -> None:
    assert log_record_subject(ENV, "VID-001", NAME) == f"fleet.{ENV}.veh.VID-001.logs.n.{NAME}"
    for bad in ("a b.bin", "x.*", "1>.bin", ""):
        with pytest.raises(Exception, match="subject token"):
            log_record_subject(ENV, "VID-001", bad)
    assert logstore.split_object(f"logs/VID-001/{NAME}") == ("VID-001", NAME)
    with pytest.raises(ValueError):
        logstore.split_object("missions/x.plan")
