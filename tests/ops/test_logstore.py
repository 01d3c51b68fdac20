"""TWIN_LOGS: flight logs under the vehicle's own subjects, resumable at chunk level, against a real nats-server.

The chunk code is TWIN_BLOBS's (`mavjet.gateway.stores.chunks.put_chunks` / `get_chunks`);
these tests show it holds for the per-vehicle subjects, with the journal read
by a direct get of the last chunk (what a scoped vehicle credential may do)
and chunks read through a filtered consumer. What crosses the wire is counted
by a second connection subscribed to the logs subjects (the rig: tests/support/transfer.py).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client

from mavjet.contract.subjects import LOGS_STREAM, log_chunk_subject, log_record_subject
from mavjet.gateway.stores import logstore
from mavjet.gateway.stores.chunks import BlobError, BlobFailure
from mavjet.ops.natsserver import NatsServer
from tests.support.transfer import CHUNK, Cut, Wire, corrupt_chunk, cut_after, settle, wire_spy

ENV = "test"
DATA = os.urandom(CHUNK * 10 + 123)  # 11 chunks, the last one short
HEX = hashlib.sha256(DATA).hexdigest()
NAME = "7-20261123T101010Z.bin"


@pytest.fixture
async def wire(provisioned: Client, nats_server: NatsServer) -> AsyncIterator[Wire]:
    async with wire_spy(nats_server.url, f"fleet.{ENV}.veh.*.logs.>", only=".logs.c.") as w:
        yield w


async def test_interrupted_upload_resumes_at_the_last_stored_chunk(provisioned: Client, wire: Wire) -> None:
    js = provisioned.jetstream()
    with pytest.raises(Cut):
        await logstore.put_log(js, ENV, "VID-001", NAME, DATA, log_id=7, chunk_bytes=CHUNK, progress=cut_after(4))
    await settle(provisioned)
    assert wire.msgs == 4
    assert await logstore.read_record(js, ENV, "VID-001", NAME) is None  # not listed until complete
    done = await logstore.put_log(js, ENV, "VID-001", NAME, DATA, log_id=7, chunk_bytes=CHUNK)
    await settle(provisioned)
    assert (done.resumed_at_chunk, done.sent_chunks, done.sent_bytes) == (4, 7, len(DATA) - 4 * CHUNK)
    assert (wire.msgs, wire.bytes) == (11, len(DATA)), "only the missing chunks were sent"
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
    await corrupt_chunk(js, LOGS_STREAM, log_chunk_subject(ENV, "VID-001", HEX), chunks=11, index=3)
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
