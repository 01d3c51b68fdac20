"""`mavjet backup` then `mavjet restore` into an empty server gives back the same data."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.js import api as jsapi
from nats.js.errors import NotFoundError

from mavjet.contract import envelope
from mavjet.contract.natsconn import open_client
from mavjet.contract.subjects import cmd_subject, event_subject, shadow_key, state_subject
from mavjet.ops.natsserver import NatsServer
from mavjet.ops.restore import replay_headers

TWIN = ["KV_TWIN_LEASES", "KV_TWIN_ROLLOUTS", "KV_TWIN_SHADOW", "OBJ_TWIN_BLOBS", "TWIN_CMD", "TWIN_EVENTS", "TWIN_LOGS",
        "TWIN_STATE", "TWIN_TRACKS"]
BIG = bytes((i * 7 + 3) % 251 for i in range(300_000))  # 3 chunks of 128KB


@pytest.fixture
async def target(tmp_path: Path) -> AsyncIterator[tuple[NatsServer, Client]]:
    srv = NatsServer(store_dir=str(tmp_path / "target-js"), log_file=str(tmp_path / "target.log"))
    srv.start()
    nc = await open_client(srv.url, connect_timeout=2)
    try:
        yield srv, nc
    finally:
        await nc.close()
        srv.cleanup()


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mavjet.ops", *args], capture_output=True, text=True,
                          timeout=120, check=False)


async def fill(nc: Client) -> None:
    js = nc.jetstream()
    for i in range(50):
        body = envelope.pack("VID-001", 1_700_000_000_000_000_000 + i, {"i": i})
        await js.publish(event_subject("test", "VID-001", "statustext"), body,
                         headers={**envelope.HEADERS, "Nats-Msg-Id": f"VID-001:statustext:{i}"})
    for ch in ("position", "battery"):
        await js.publish(state_subject("test", "VID-002", ch), envelope.pack("VID-002", 1, {"ch": ch}),
                         headers=envelope.HEADERS)
    # The gateway's consumer exists: a workqueue admits no second overlapping consumer,
    # so the backup must read TWIN_CMD without one (and without consuming the commands).
    await js.add_consumer("TWIN_CMD", jsapi.ConsumerConfig(
        durable_name="gw-VID-001", filter_subject="fleet.test.veh.VID-001.cmd.>",
        ack_policy=jsapi.AckPolicy.EXPLICIT))
    for i in range(2):
        await js.publish(cmd_subject("test", "VID-001", "arm"), f"cmd-{i}".encode(), headers={"Nats-Msg-Id": f"cmd-{i}"})
    kv = await js.key_value("TWIN_SHADOW")
    desired = shadow_key("test", "VID-001", "desired")
    rev = await kv.put(desired, b'{"mode":"GUIDED"}')
    rev = await kv.update(desired, b'{"mode":"AUTO"}', last=rev)  # stores Nats-Expected-Last-Subject-Sequence
    await kv.put(desired, b'{"mode":"RTL"}')
    await kv.put(shadow_key("test", "VID-002", "meta"), b'{"serial":"X1"}')
    await kv.delete(shadow_key("test", "VID-002", "meta"))
    obs = await js.object_store("TWIN_BLOBS")
    await obs.put("logs/VID-001/flight-1.bin", BIG)
    await obs.put("missions/m-1.plan", b'{"items":[]}')


async def read_all(nc: Client, stream: str) -> list[tuple[str, dict[str, str] | None, bytes]]:
    js = nc.jetstream()
    info = await js.stream_info(stream)
    out: list[tuple[str, dict[str, str] | None, bytes]] = []
    if info.state.messages == 0:
        return out
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            m = await js.get_msg(stream, seq)
        except NotFoundError:
            continue
        out.append((m.subject, replay_headers(m.headers), m.data or b""))
    return out


async def test_backup_restore_round_trip(provisioned: Client, nats_server: NatsServer,
                                         target: tuple[NatsServer, Client], tmp_path: Path) -> None:
    await fill(provisioned)
    out_dir = tmp_path / "backup"
    b = cli("backup", "--nats", nats_server.url, "--out", str(out_dir))
    assert b.returncode == 0, b.stderr
    manifest = json.loads((out_dir / "manifest.json").read_text())
    assert sorted(s["name"] for s in manifest["streams"]) == TWIN
    counts = {s["name"]: s["messages"] for s in manifest["streams"]}
    assert counts["TWIN_EVENTS"] == 50 and counts["TWIN_CMD"] == 2 and counts["TWIN_STATE"] == 2
    assert (await provisioned.jetstream().stream_info("TWIN_CMD")).state.messages == 2  # not consumed

    tsrv, tnc = target
    r = cli("restore", str(out_dir), "--nats", tsrv.url)
    assert r.returncode == 0, r.stderr
    assert "2 queued commands not replayed" in r.stdout

    for stream in TWIN:
        src_cfg = (await provisioned.jetstream().stream_info(stream)).config
        dst_cfg = (await tnc.jetstream().stream_info(stream)).config
        for field in ("subjects", "retention", "max_age", "max_bytes", "max_msgs_per_subject",
                      "duplicate_window", "allow_rollup_hdrs", "allow_direct", "discard", "max_msg_size"):
            assert getattr(dst_cfg, field) == getattr(src_cfg, field), (stream, field)
        if stream == "TWIN_CMD":
            assert await read_all(tnc, stream) == []
        else:
            assert await read_all(tnc, stream) == await read_all(provisioned, stream), stream

    # Through the KV and object store APIs, as users see them.
    tjs = tnc.jetstream()
    kv = await tjs.key_value("TWIN_SHADOW")
    hist = await kv.history(shadow_key("test", "VID-001", "desired"))
    assert [e.value for e in hist] == [b'{"mode":"GUIDED"}', b'{"mode":"AUTO"}', b'{"mode":"RTL"}']
    with pytest.raises(Exception):  # noqa: B017 - deleted key stays deleted (KeyDeletedError / KeyNotFoundError)
        await kv.get(shadow_key("test", "VID-002", "meta"))
    meta_hist = await kv.history(shadow_key("test", "VID-002", "meta"))
    assert [e.operation for e in meta_hist] == [None, "DEL"]
    obs = await tjs.object_store("TWIN_BLOBS")
    got = await obs.get("logs/VID-001/flight-1.bin")
    assert got.data == BIG and got.info.size == len(BIG)
    assert (await obs.get("missions/m-1.plan")).data == b'{"items":[]}'
    # Sequence numbers carried over where the stream has no gaps.
    src_ev = await provisioned.jetstream().stream_info("TWIN_EVENTS")
    dst_ev = await tjs.stream_info("TWIN_EVENTS")
    assert (dst_ev.state.first_seq, dst_ev.state.last_seq) == (src_ev.state.first_seq, src_ev.state.last_seq)
    # The restored events stream still de-duplicates by Nats-Msg-Id with its own window.
    ack = await tjs.publish(event_subject("test", "VID-001", "statustext"), b"again",
                            headers={"Nats-Msg-Id": "VID-001:statustext:49"})
    assert ack.duplicate

    # A second restore does not clobber data...
    again = cli("restore", str(out_dir), "--nats", tsrv.url)
    assert again.returncode == 2 and "--replace" in again.stderr
    # ...unless asked to; --with-commands also brings the queued commands back.
    again = cli("restore", str(out_dir), "--nats", tsrv.url, "--replace", "--with-commands",
                "--streams", "TWIN_CMD")
    assert again.returncode == 0, again.stderr
    assert [d for _, _, d in await read_all(tnc, "TWIN_CMD")] == [b"cmd-0", b"cmd-1"]


async def test_messages_sharing_an_id_are_both_restored(nc: Client, nats_server: NatsServer,
                                                        target: tuple[NatsServer, Client],
                                                        tmp_path: Path) -> None:
    """Two messages with one Nats-Msg-Id, published further apart than the window, both survive."""
    js = nc.jetstream()
    await js.add_stream(jsapi.StreamConfig(name="TWIN_DEDUP", subjects=["dedup.>"], duplicate_window=0.1))
    a = await js.publish("dedup.x", b"first", headers={"Nats-Msg-Id": "same"})
    await asyncio.sleep(0.3)
    b = await js.publish("dedup.x", b"second", headers={"Nats-Msg-Id": "same"})
    assert not b.duplicate and b.seq == a.seq + 1
    out_dir = tmp_path / "b"
    assert cli("backup", "--nats", nats_server.url, "--out", str(out_dir), "--streams", "TWIN_DEDUP").returncode == 0
    tsrv, tnc = target
    r = cli("restore", str(out_dir), "--nats", tsrv.url)
    assert r.returncode == 0, r.stderr
    assert [d for _, _, d in await read_all(tnc, "TWIN_DEDUP")] == [b"first", b"second"]


def test_damaged_or_incomplete_backup_is_refused(nats_server: NatsServer, tmp_path: Path) -> None:
    async def setup() -> None:
        client = await open_client(nats_server.url)
        try:
            await client.jetstream().add_stream(jsapi.StreamConfig(name="TWIN_X", subjects=["x.>"]))
            for i in range(3):
                await client.jetstream().publish("x.y", f"m{i}".encode())
        finally:
            await client.close()

    asyncio.run(setup())
    out_dir = tmp_path / "b"
    assert cli("backup", "--nats", nats_server.url, "--out", str(out_dir)).returncode == 0
    # Backing up into a non-empty directory is refused.
    assert "not empty" in cli("backup", "--nats", nats_server.url, "--out", str(out_dir)).stderr
    msgs = out_dir / "TWIN_X.msgs"
    data = bytearray(msgs.read_bytes())
    data[-1] ^= 0xFF
    msgs.write_bytes(bytes(data))
    bad = cli("restore", str(out_dir), "--nats", nats_server.url, "--replace")
    assert bad.returncode == 2 and "checksum" in bad.stderr
    os.remove(out_dir / "manifest.json")
    bad = cli("restore", str(out_dir), "--nats", nats_server.url)
    assert bad.returncode == 2 and "not a complete mavjet backup" in bad.stderr


def test_replay_headers_drops_only_preconditions() -> None:
    assert replay_headers({"Nats-Expected-Last-Subject-Sequence": "4", "KV-Operation": "DEL"}) == {
        "KV-Operation": "DEL"}
    assert replay_headers({"Nats-Expected-Stream": "X"}) is None
    assert replay_headers({"Nats-Msg-Id": "a", "Content-Type": "application/msgpack"}) == {
        "Nats-Msg-Id": "a", "Content-Type": "application/msgpack"}
