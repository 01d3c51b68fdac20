"""A 3-node JetStream cluster on loopback survives losing a node.

`mavjet provision --replicas 3` against the cluster, then events are published
with Nats-Msg-Id while the TWIN_EVENTS stream leader is killed and restarted:
no event may be lost or duplicated, and TWIN_CMD (workqueue + durable pull
consumer) and TWIN_SHADOW (KV) keep working through the failover.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
from nats.aio.client import Client
from nats.js import api as jsapi

from mavjet.contract import envelope
from mavjet.contract.subjects import cmd_subject, event_subject, shadow_key
from mavjet.ops.health import collect_health
from tests.support.cluster import NatsCluster

pytestmark = pytest.mark.slow

T = TypeVar("T")
ENV = "test"
N_EVENTS = 300


async def retrying(op: Callable[[], Awaitable[T]], *, timeout_s: float = 30.0, what: str = "") -> T:
    """Retry an operation through a leader election, with a deadline."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            return await op()
        except Exception as exc:  # timeouts, 503 no responders, "JetStream not ready"
            last = exc
            await asyncio.sleep(0.1)
    raise AssertionError(f"{what or 'operation'} did not succeed within {timeout_s}s: {last!r}")


def provision_cluster(cluster: NatsCluster, deadline_s: float = 60.0) -> str:
    exe = [sys.executable, "-m", "mavjet.ops", "provision", "--replicas", "3", "--env", ENV,
           "--nats", cluster.url_list]
    deadline = time.monotonic() + deadline_s
    while True:
        out = subprocess.run(exe, capture_output=True, text=True, timeout=60, check=False)
        if out.returncode == 0:
            return out.stdout
        # Right after boot, peers may still be joining: R3 placement fails until all three are known.
        if time.monotonic() > deadline:
            raise AssertionError(f"provision failed: {out.stdout}{out.stderr}")
        time.sleep(0.5)


async def test_provision_r3_and_failover(nats_cluster: NatsCluster, cluster_nc: Client) -> None:
    out = provision_cluster(nats_cluster)
    assert "create    stream TWIN_EVENTS" in out and "create    kv TWIN_SHADOW" in out
    js = cluster_nc.jetstream(timeout=2)
    for stream in ("TWIN_STATE", "TWIN_EVENTS", "TWIN_CMD", "KV_TWIN_SHADOW", "OBJ_TWIN_BLOBS", "KV_TWIN_LEASES"):
        info = await retrying(lambda s=stream: js.stream_info(s), what=f"{stream} info")  # type: ignore[misc]
        assert info.config.num_replicas == 3, stream

    # Command consumer and shadow, before the failure.
    consumer = "gw-VID-001"
    await retrying(lambda: js.add_consumer(
        "TWIN_CMD",
        jsapi.ConsumerConfig(
            durable_name=consumer, filter_subject=f"fleet.{ENV}.veh.VID-001.cmd.>",
            ack_policy=jsapi.AckPolicy.EXPLICIT, ack_wait=5.0,
        ),
    ), what="add consumer")
    psub = await retrying(lambda: js.pull_subscribe_bind(consumer, stream="TWIN_CMD"), what="bind")
    kv = await retrying(lambda: js.key_value("TWIN_SHADOW"), what="kv bind")
    key = shadow_key(ENV, "VID-001", "desired")
    rev1 = await retrying(lambda: kv.put(key, b'{"mode":"GUIDED"}'), what="kv put")

    executed: list[str] = []

    async def run_command(cmd_id: str) -> None:
        await retrying(
            lambda: js.publish(cmd_subject(ENV, "VID-001", "arm"), cmd_id.encode(),
                               headers={"Nats-Msg-Id": cmd_id}),
            what=f"publish {cmd_id}",
        )

        async def take() -> None:
            msgs = await psub.fetch(1, timeout=1.0)
            for m in msgs:
                executed.append(m.data.decode())
                await m.ack_sync(timeout=2)

        await retrying(take, what=f"fetch {cmd_id}")

    await run_command("cmd-1")

    # Publish events continuously; kill the stream leader a third of the way in.
    kill_now = asyncio.Event()
    killed = asyncio.Event()
    duplicates_acked = 0

    async def publisher() -> None:
        nonlocal duplicates_acked
        for i in range(N_EVENTS):
            if i == N_EVENTS // 3:
                kill_now.set()
                await killed.wait()
            msg_id = f"VID-001:armed:{i}"
            payload = envelope.pack("VID-001", 1_700_000_000_000_000_000 + i, {"i": i})

            async def send(mid: str = msg_id, body: bytes = payload) -> jsapi.PubAck:
                return await js.publish(
                    event_subject(ENV, "VID-001", "armed"), body,
                    headers={**envelope.HEADERS, "Nats-Msg-Id": mid}, timeout=2,
                )

            ack = await retrying(send, what=f"publish event {i}")
            if ack.duplicate:
                duplicates_acked += 1

    pub = asyncio.create_task(publisher())
    await asyncio.wait_for(kill_now.wait(), 60)
    async def leader() -> str:
        inf = await js.stream_info("TWIN_EVENTS")
        assert inf.cluster is not None and inf.cluster.leader in nats_cluster.names
        return inf.cluster.leader

    victim_name = await retrying(leader, what="TWIN_EVENTS leader")
    victim = nats_cluster.node_named(victim_name)
    victim.stop(kill=True)
    killed.set()

    # While the node is down: commands and shadow still work (2 of 3 is a quorum).
    await run_command("cmd-2")
    rev2 = await retrying(lambda: kv.update(key, b'{"mode":"RTL"}', last=rev1), what="kv update")
    assert rev2 > rev1
    # Let the publisher get well past the failure before the node comes back.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        st = await retrying(lambda: js.stream_info("TWIN_EVENTS"), what="info while down")
        if st.state.messages >= 2 * N_EVENTS // 3:
            assert st.cluster is not None and st.cluster.leader not in (None, victim_name)
            break
        await asyncio.sleep(0.1)
    victim.start()
    await asyncio.wait_for(pub, 120)
    await run_command("cmd-3")
    rev3 = await retrying(lambda: kv.update(key, b'{"mode":"LOITER"}', last=rev2), what="kv update 2")

    # Every event exactly once, in order.
    info = await retrying(lambda: js.stream_info("TWIN_EVENTS"), what="final info")
    assert info.state.messages == N_EVENTS
    seen: list[str] = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        m = await retrying(lambda s=seq: js.get_msg("TWIN_EVENTS", s), what=f"get {seq}")  # type: ignore[misc]
        assert m.headers is not None
        seen.append(m.headers["Nats-Msg-Id"])
        assert envelope.unpack(m.data or b"").data == {"i": len(seen) - 1}
    assert seen == [f"VID-001:armed:{i}" for i in range(N_EVENTS)]

    # Commands: each executed once, and the workqueue is empty.
    assert executed == ["cmd-1", "cmd-2", "cmd-3"]
    assert (await retrying(lambda: js.stream_info("TWIN_CMD"), what="cmd info")).state.messages == 0
    # Shadow: the whole history survived, latest value readable.
    # All three updates were acknowledged by the R3 stream (they returned
    # revisions), but a history read issued just after the restarted node
    # rejoins was once seen to stop after the first entry. Give the read
    # (not the check) a bounded chance to see the acknowledged history.
    hist_deadline = time.monotonic() + 20
    while True:
        hist = await retrying(lambda: kv.history(key), what="kv history")
        if len(hist) >= 3 or time.monotonic() > hist_deadline:
            break
        await asyncio.sleep(0.5)
    assert [e.value for e in hist] == [b'{"mode":"GUIDED"}', b'{"mode":"RTL"}', b'{"mode":"LOITER"}']
    assert hist[-1].revision == rev3

    # The restarted node catches up: every replica current, no lag (what `mavjet monitor` reports).
    deadline = time.monotonic() + 60
    behind: list[str] = ["?"]
    while time.monotonic() < deadline:
        health = await retrying(lambda: collect_health(js), what="health")
        behind = [f"{r.stream}/{r.peer}" for r in health.replicas if not r.current or r.lag > 0 or r.offline]
        peers = {r.peer for r in health.replicas if r.stream == "TWIN_EVENTS"}
        if not behind and len(peers) == 2:
            break
        await asyncio.sleep(0.5)
    assert behind == [], f"replicas still behind after restart: {behind}"
