"""Migration between clusters with a mirror, following seed 000's five steps
(docs/operations.md), between two local servers linked by a leaf node.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from nats.aio.client import Client

from mavjet.contract import envelope
from mavjet.contract.natsconn import open_client
from mavjet.contract.subjects import cmd_subject, event_subject, shadow_key
from mavjet.ops.migrate import mirror_config, promoted_config
from mavjet.ops.natsserver import NatsServer, free_port

ENV = "test"
# The link between the clusters carries JetStream API and mirror traffic only:
# application subjects stay on their own side, so a stream on one side never
# captures the other side's publishes.
LINK_DENY = '["fleet.>", "$KV.>", "$O.>"]'


@dataclass
class Pair:
    src: NatsServer
    dst: NatsServer
    src_nc: Client
    dst_nc: Client


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[Pair]:
    leaf_port = free_port()
    (tmp_path / "src.conf").write_text(
        "server_name: old-hub\n"
        "jetstream { domain: old, max_file_store: 1TB }\n"
        f"leafnodes {{ listen: 127.0.0.1:{leaf_port} }}\n")
    (tmp_path / "dst.conf").write_text(
        "server_name: new-hub\n"
        "jetstream { domain: new, max_file_store: 1TB }\n"
        f"leafnodes {{ remotes: [ {{ url: \"nats-leaf://127.0.0.1:{leaf_port}\", "
        f"deny_imports: {LINK_DENY}, deny_exports: {LINK_DENY} }} ] }}\n")
    src = NatsServer(config_file=str(tmp_path / "src.conf"), store_dir=str(tmp_path / "src"),
                     log_file=str(tmp_path / "src.log")).start()
    dst = NatsServer(config_file=str(tmp_path / "dst.conf"), store_dir=str(tmp_path / "dst"),
                     log_file=str(tmp_path / "dst.log")).start()
    src_nc = await open_client(src.url)
    dst_nc = await open_client(dst.url)
    try:
        # Wait for the leaf link: the source's JetStream API answers through the target.
        for _ in range(100):
            try:
                await dst_nc.request("$JS.old.API.INFO", b"", timeout=0.5)
                break
            except Exception:
                await asyncio.sleep(0.1)
        else:
            raise AssertionError("leaf link between the servers did not come up")
        yield Pair(src, dst, src_nc, dst_nc)
    finally:
        await src_nc.close()
        await dst_nc.close()
        src.cleanup()
        dst.cleanup()


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, check=False)


def migrate(*args: str) -> subprocess.CompletedProcess[str]:
    return cli("-m", "mavjet.ops.migrate", *args)


def mavjet(*args: str) -> subprocess.CompletedProcess[str]:
    return cli("-m", "mavjet.ops", *args)


async def publish_events(nc: Client, start: int, stop: int) -> list[bool]:
    js = nc.jetstream()
    dups = []
    for i in range(start, stop):
        ack = await js.publish(event_subject(ENV, "VID-001", "armed"),
                               envelope.pack("VID-001", 1_700_000_000_000_000_000 + i, {"i": i}),
                               headers={**envelope.HEADERS, "Nats-Msg-Id": f"VID-001:armed:{i}"})
        assert ack.stream == "TWIN_EVENTS"
        dups.append(bool(ack.duplicate))
    return dups


def test_mirror_and_promoted_configs() -> None:
    src = {"name": "TWIN_EVENTS", "subjects": ["fleet.prod.veh.*.evt.>"], "max_age": 7776000000000000,
           "duplicate_window": 600000000000, "retention": "limits"}
    m = mirror_config(src, source_domain="old")
    assert "subjects" not in m and m["mirror"] == {"name": "TWIN_EVENTS", "external": {"api": "$JS.old.API"}}
    assert m["max_age"] == src["max_age"] and m["duplicate_window"] == src["duplicate_window"]
    p = promoted_config(m, src)
    assert "mirror" not in p and p["subjects"] == src["subjects"]


async def test_five_step_migration(pair: Pair, tmp_path: Path) -> None:
    src_url, dst_url = pair.src.url, pair.dst.url
    out = mavjet("provision", "--nats", src_url, "--env", ENV)
    assert out.returncode == 0, out.stderr
    sjs = pair.src_nc.jetstream()
    await publish_events(pair.src_nc, 0, 100)
    kv = await sjs.key_value("TWIN_SHADOW")
    key = shadow_key(ENV, "VID-001", "desired")
    for mode in ("GUIDED", "AUTO", "RTL"):
        await kv.put(key, f'{{"mode":"{mode}"}}'.encode())
    obs = await sjs.object_store("TWIN_BLOBS")
    await obs.put("missions/m-1.plan", b"x" * 200_000)
    await sjs.publish(cmd_subject(ENV, "VID-001", "rtl"), b"queued", headers={"Nats-Msg-Id": "cmd-q"})

    # Steps 1 and 2: the target streams, same config, mirroring the originals, while producers run.
    producer = asyncio.create_task(publish_events(pair.src_nc, 100, 200))
    out = migrate("mirror", "--from", src_url, "--to", dst_url, "--from-domain", "old")
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.split()[1::2]) == ["KV_TWIN_LEASES", "KV_TWIN_ROLLOUTS", "KV_TWIN_SHADOW", "OBJ_TWIN_BLOBS",
                                                "TWIN_EVENTS", "TWIN_LOGS", "TWIN_STATE", "TWIN_TRACKS"]
    await asyncio.wait_for(producer, 60)  # producers stop (gateways spool meanwhile)

    # Step 3: wait for sync.
    out = migrate("status", "--from", src_url, "--to", dst_url, "--wait", "30")
    assert out.returncode == 0 and out.stdout.count("in sync") == 8, out.stdout + out.stderr
    # Queued commands move with backup/restore (a workqueue is not mirrored).
    bdir = tmp_path / "cmd-backup"
    assert mavjet("backup", "--nats", src_url, "--streams", "TWIN_CMD", "--out", str(bdir)).returncode == 0
    out = mavjet("restore", str(bdir), "--nats", dst_url, "--with-commands")
    assert out.returncode == 0, out.stderr

    # Step 4: promote, check the definitions hold, switch producers and consumers.
    out = migrate("promote", "--from", src_url, "--to", dst_url)
    assert out.returncode == 0, out.stderr
    out = mavjet("provision", "--nats", dst_url, "--env", ENV)
    assert out.returncode == 0 and out.stdout.count("unchanged") == 9, out.stdout + out.stderr
    # A gateway replaying its spool after the switch: the last events come again and are de-duplicated.
    dups = await publish_events(pair.dst_nc, 197, 210)
    assert dups == [True] * 3 + [False] * 10

    # Step 5: remove the originals.
    assert migrate("remove", "--from", src_url).returncode == 2  # needs --yes
    out = migrate("remove", "--from", src_url, "--yes")
    assert out.returncode == 0, out.stderr
    assert [s for s in await sjs.streams_info() if s.config.name.startswith(("TWIN_", "KV_", "OBJ_"))] == []

    # The target has everything, once, in order, with the original sequence numbers.
    djs = pair.dst_nc.jetstream()
    info = await djs.stream_info("TWIN_EVENTS")
    assert (info.state.first_seq, info.state.last_seq, info.state.messages) == (1, 210, 210)
    ids = []
    for seq in range(1, 211):
        m = await djs.get_msg("TWIN_EVENTS", seq)
        assert m.headers is not None
        ids.append(m.headers["Nats-Msg-Id"])
    assert ids == [f"VID-001:armed:{i}" for i in range(210)]
    dkv = await djs.key_value("TWIN_SHADOW")
    hist = await dkv.history(key)
    assert [e.value for e in hist] == [b'{"mode":"GUIDED"}', b'{"mode":"AUTO"}', b'{"mode":"RTL"}']
    # Revisions carried over: optimistic concurrency against the old revision still works.
    rev = await dkv.update(key, b'{"mode":"LOITER"}', last=hist[-1].revision)
    assert rev == hist[-1].revision + 1
    assert (await (await djs.object_store("TWIN_BLOBS")).get("missions/m-1.plan")).data == b"x" * 200_000
    cmd = await djs.get_msg("TWIN_CMD", (await djs.stream_info("TWIN_CMD")).state.first_seq)
    assert cmd.data == b"queued"
