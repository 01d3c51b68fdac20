"""The TWIN_LOGS and TWIN_TRACKS rows of the matrix, both ways, on a real nats-server with the generated auth.

A vehicle writes and reads its own flight logs (fleet.<env>.veh.<vid>.logs.>)
and nothing of another vehicle's; the operator reads every log and writes
none; viewer and analytics see no log. Every identity with a vehicle may
publish its own track; operator, viewer and analytics read TWIN_TRACKS.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from nats.js import api as jsapi
from nats.js.errors import NotFoundError

from mavjet.contract import envelope
from mavjet.contract.subjects import (
    LOGS_STREAM,
    TRACKS_STREAM,
    log_chunk_subject,
    log_record_subject,
    log_records_filter,
    track_subject,
)
from mavjet.gateway.stores import logstore
from tests.security.conftest import ENV, Secured
from tests.security.support import JS_TIMEOUT_S, clean, refused

pytestmark = pytest.mark.timeout(90)

LOG = os.urandom(300_000)  # 3 chunks of 128 KiB
NAME = "1-20261123T021320Z.bin"


async def test_vehicle_writes_and_reads_its_own_logs_only(hub: Secured, tmp_path: Path) -> None:
    v1, v2 = await hub.connect("VID-001"), await hub.connect("VID-002")
    try:
        js1 = v1.jetstream(timeout=JS_TIMEOUT_S)
        t = await logstore.put_log(js1, ENV, "VID-001", NAME, LOG, log_id=1)
        assert t.sha256 == hashlib.sha256(LOG).hexdigest() and t.chunks == 3 and t.sent_bytes == len(LOG)
        again = await logstore.put_log(js1, ENV, "VID-001", NAME, LOG, log_id=1)
        assert again.already_present and again.sent_bytes == 0
        # Resumable with a per-subject credential: the same bytes under another name send nothing new.
        other = await logstore.put_log(js1, ENV, "VID-001", "2-undated.bin", LOG, log_id=2)
        assert other.sent_chunks == 0 and other.resumed_at_chunk == 3
        records = await logstore.list_logs(js1, ENV, "VID-001")
        assert [(r.log_id, r.name, r.size_bytes) for r in records] == [(1, NAME, len(LOG)), (2, "2-undated.bin", len(LOG))]
        out = tmp_path / "own.bin"
        got = await logstore.get_log(js1, ENV, "VID-001", NAME, out)
        assert out.read_bytes() == LOG and got.sha256 == t.sha256
        clean(v1)

        # Hostile: VID-002 writes into VID-001's logs, reads its record, lists them, reads its chunks.
        js2 = v2.jetstream(timeout=JS_TIMEOUT_S)
        forged = log_record_subject(ENV, "VID-001", NAME)
        await refused(v2, forged, lambda: js2.publish(forged, b'{"forged": true}'))
        chunk = log_chunk_subject(ENV, "VID-001", hashlib.sha256(b"evil").hexdigest())
        await refused(v2, chunk, lambda: js2.publish(chunk, b"evil"))
        await refused(v2, f"$JS.API.DIRECT.GET.{LOGS_STREAM}.{log_record_subject(ENV, 'VID-001', '3-undated.bin')}",
                      lambda: logstore.put_log(js2, ENV, "VID-001", "3-undated.bin", b"evil"))
        await refused(v2, f"$JS.API.DIRECT.GET.{LOGS_STREAM}.{forged}",
                      lambda: logstore.read_record(js2, ENV, "VID-001", NAME))
        await refused(v2, f"$JS.API.CONSUMER.CREATE.{LOGS_STREAM}",
                      lambda: logstore.list_logs(js2, ENV, "VID-001"))
        await refused(v2, f"$JS.API.CONSUMER.CREATE.{LOGS_STREAM}", lambda: logstore.list_logs(js2, ENV))
        reader = logstore.ConsumerChunkReader(js2, log_chunk_subject(ENV, "VID-001", t.sha256))
        await refused(v2, f"$JS.API.CONSUMER.CREATE.{LOGS_STREAM}", lambda: reader.chunk_at(1))
        await reader.close()
        # ... or reaches them by the stream-wide APIs (body-addressed gets, stream info, unfiltered consumers).
        await refused(v2, f"$JS.API.DIRECT.GET.{LOGS_STREAM}",
                      lambda: js2.get_msg(LOGS_STREAM, seq=1, subject=forged, direct=True))
        await refused(v2, f"$JS.API.STREAM.MSG.GET.{LOGS_STREAM}", lambda: js2.get_msg(LOGS_STREAM, seq=1))
        await refused(v2, f"$JS.API.STREAM.INFO.{LOGS_STREAM}", lambda: js2.stream_info(LOGS_STREAM))
        await refused(v2, f"$JS.API.CONSUMER.CREATE.{LOGS_STREAM}",
                      lambda: js2.subscribe(log_records_filter(ENV), stream=LOGS_STREAM, ordered_consumer=True))
        await refused(v2, f"$JS.API.STREAM.PURGE.{LOGS_STREAM}", lambda: js2.purge_stream(LOGS_STREAM))
        # VID-001's log is untouched, and VID-002's own logs still work.
        assert (await logstore.read_record(js1, ENV, "VID-001", NAME)) == records[0]
        await logstore.put_log(js2, ENV, "VID-002", NAME, b"vid-002's own log", log_id=1)
        assert [r.vid for r in await logstore.list_logs(js2, ENV, "VID-002")] == ["VID-002"]
    finally:
        await v1.close()
        await v2.close()


async def test_hub_gateway_writes_the_logs_of_its_vehicles_only(hub: Secured) -> None:
    gw = await hub.connect("hub")
    try:
        js = gw.jetstream(timeout=JS_TIMEOUT_S)
        for vid in ("VID-003", "VID-004"):
            await logstore.put_log(js, ENV, vid, NAME, vid.encode() * 1000, log_id=1)
            assert [r.vid for r in await logstore.list_logs(js, ENV, vid)] == [vid]
        clean(gw)
        chunk = log_chunk_subject(ENV, "VID-001", hashlib.sha256(b"x").hexdigest())
        await refused(gw, chunk, lambda: js.publish(chunk, b"x"))
    finally:
        await gw.close()


async def test_operator_reads_every_log_and_writes_none(hub: Secured, tmp_path: Path) -> None:
    v1, v2, op = await hub.connect("VID-001"), await hub.connect("VID-002"), await hub.connect("operator")
    try:
        await logstore.put_log(v1.jetstream(), ENV, "VID-001", NAME, LOG, log_id=1)
        await logstore.put_log(v2.jetstream(), ENV, "VID-002", NAME, b"two" * 100, log_id=1)
        ojs = op.jetstream(timeout=JS_TIMEOUT_S)
        assert [r.object for r in await logstore.list_logs(ojs, ENV)] == [f"logs/VID-001/{NAME}", f"logs/VID-002/{NAME}"]
        out = tmp_path / "op.bin"
        await logstore.get_log(ojs, ENV, "VID-001", NAME, out)
        assert out.read_bytes() == LOG
        clean(op)
        forged = log_record_subject(ENV, "VID-001", NAME)
        await refused(op, forged, lambda: ojs.publish(forged, b"{}"))
        await refused(op, f"$JS.API.STREAM.PURGE.{LOGS_STREAM}", lambda: ojs.purge_stream(LOGS_STREAM))
    finally:
        for nc in (v1, v2, op):
            await nc.close()


async def test_viewer_and_analytics_see_no_log(hub: Secured) -> None:
    v1 = await hub.connect("VID-001")
    try:
        await logstore.put_log(v1.jetstream(), ENV, "VID-001", NAME, b"log", log_id=1)
    finally:
        await v1.close()
    for role in ("viewer", "analytics"):
        nc = await hub.connect(role)
        try:
            js = nc.jetstream(timeout=JS_TIMEOUT_S)
            await refused(nc, f"$JS.API.CONSUMER.CREATE.{LOGS_STREAM}", lambda js=js: logstore.list_logs(js, ENV))  # type: ignore[misc]
            await refused(nc, f"$JS.API.DIRECT.GET.{LOGS_STREAM}",
                          lambda js=js: logstore.read_record(js, ENV, "VID-001", NAME))  # type: ignore[misc]
        finally:
            await nc.close()


async def _tracks_stream(hub: Secured) -> None:
    """TWIN_TRACKS as provisioning defines it (created here only while its definition is not yet in deploy/)."""
    admin = await hub.connect("admin")
    try:
        js = admin.jetstream()
        try:
            await js.stream_info(TRACKS_STREAM)
        except NotFoundError:
            await js.add_stream(jsapi.StreamConfig(name=TRACKS_STREAM, subjects=[track_subject(ENV, "*")]))
    finally:
        await admin.close()


async def test_tracks_published_by_their_own_vehicle_read_by_operator_viewer_analytics(hub: Secured) -> None:
    await _tracks_stream(hub)
    v1, v2 = await hub.connect("VID-001"), await hub.connect("VID-002")
    try:
        ack = await v1.jetstream(timeout=JS_TIMEOUT_S).publish(track_subject(ENV, "VID-001"),
                                                               envelope.pack("VID-001", 1_000_000_000, {}))
        assert ack.stream == TRACKS_STREAM
        clean(v1)
        forged = track_subject(ENV, "VID-001")
        await refused(v2, forged, lambda: v2.publish(forged, b"{}"))
        await refused(v2, f"$JS.API.CONSUMER.CREATE.{TRACKS_STREAM}",
                      lambda: v2.jetstream(timeout=JS_TIMEOUT_S).subscribe(
                          track_subject(ENV, "*"), stream=TRACKS_STREAM, ordered_consumer=True))
    finally:
        await v1.close()
        await v2.close()
    for role in ("operator", "viewer", "analytics"):
        nc = await hub.connect(role)
        try:
            js = nc.jetstream(timeout=JS_TIMEOUT_S)
            sub = await js.subscribe(track_subject(ENV, "*"), stream=TRACKS_STREAM, ordered_consumer=True)
            msg = await sub.next_msg(timeout=5)
            assert msg.subject == track_subject(ENV, "VID-001")
            await sub.unsubscribe()
            clean(nc)
            await refused(nc, forged, lambda nc=nc: nc.publish(forged, b"{}"))  # type: ignore[misc]
        finally:
            await nc.close()

