"""The real gateway through a JetStream stream-leader failover on a 3-node cluster.

`test_cluster.py` proves the JetStream guarantees with a bare client; this test
puts the gateway in the middle: `mavjet provision --replicas 3`, two simulated
vehicles over MAVLink/TCP, an in-process `Gateway` that knows all three servers
and runs the command executor and the shadow reconciler. While the gateway
publishes state and events, the node leading TWIN_EVENTS is killed; during the
outage the vehicles keep producing events (mode changes over MAVLink, probe
events with known text), a command is queued on TWIN_CMD and a shadow
`desired` is written; then the node comes back.

What must hold: every event the gateway emitted is in TWIN_EVENTS exactly once
(Nats-Msg-Id unique, same set as emitted), state publishing resumes after the
restart, the outage command has exactly one accepted `cmd_result` (and the
vehicle executed it once), and the outage `desired` converges.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import anyio
from nats.aio.client import Client

from mavjet.contract import envelope
from mavjet.contract.natsconn import NatsOptions
from mavjet.contract.subjects import (
    CMD_STREAM,
    EVENTS_STREAM,
    SHADOW_BUCKET,
    STATE_STREAM,
    event_subject,
    shadow_key,
    state_subject,
)
from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.gateway.commands.consumer import CommandService
from mavjet.gateway.daemon import Gateway, with_services
from mavjet.gateway.shadow.service import ShadowService
from mavjet.gateway.twin.telemetry import Event
from mavjet.ops.client import CommandClient
from mavjet.sim.fleet import SimConfig, SimFleet
from tests.shadow.harness import FAST as FAST_SHADOW
from tests.support import gateway_config, wait_for, wait_for_async
from tests.support.cluster import NatsCluster
from tests.support.commands import TEST_COMMANDS

from .test_cluster import provision_cluster, retrying

ENV = "test"
VIDS = ("VID-001", "VID-002")
SET_MODE = mavlink2.MAV_CMD_DO_SET_MODE
PROBE = "failover probe "
PROBE_INTERVAL_S = 0.05
OUTAGE_CMD_ID = "failover-outage-cmd"
BASELINE_CMD_ID = "failover-baseline-cmd"


async def stream_events(nc: Client) -> list[tuple[str, str, dict[str, Any]]]:
    """Every message in TWIN_EVENTS as (subject, Nats-Msg-Id, envelope data), by sequence."""
    js = nc.jetstream(timeout=2)
    info = await retrying(lambda: js.stream_info(EVENTS_STREAM), what="events info")
    out: list[tuple[str, str, dict[str, Any]]] = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        m = await retrying(lambda s=seq: js.get_msg(EVENTS_STREAM, s), what=f"get event {seq}")  # type: ignore[misc]
        out.append((m.subject or "", (m.headers or {}).get("Nats-Msg-Id", ""), envelope.unpack(m.data or b"").data))
    assert len(out) == info.state.messages
    return out


async def last_event(nc: Client, vid: str, etype: str) -> dict[str, Any] | None:
    m = await nc.jetstream(timeout=2).get_last_msg(EVENTS_STREAM, event_subject(ENV, vid, etype))
    data: dict[str, Any] = envelope.unpack(m.data or b"").data
    return data


async def last_state_seq(nc: Client, vid: str) -> int:
    m = await nc.jetstream(timeout=2).get_last_msg(STATE_STREAM, state_subject(ENV, vid, "position"))
    return int(m.seq or 0)


async def test_gateway_through_events_leader_failover(
    nats_cluster: NatsCluster, cluster_nc: Client, tmp_path: Path
) -> None:
    t_start = time.monotonic()
    out = await anyio.to_thread.run_sync(provision_cluster, nats_cluster)
    assert "create    stream TWIN_EVENTS" in out
    js = cluster_nc.jetstream(timeout=2)
    for stream in (STATE_STREAM, EVENTS_STREAM, CMD_STREAM, f"KV_{SHADOW_BUCKET}"):
        info = await retrying(lambda s=stream: js.stream_info(s), what=f"{stream} info")  # type: ignore[misc]
        assert info.config.num_replicas == 3, stream
    kv = await retrying(lambda: js.key_value(SHADOW_BUCKET), what="kv bind")

    async with SimFleet(SimConfig(vehicles=len(VIDS), base_port=0, speedup=5.0)) as fleet:
        single = gateway_config(nats_cluster.urls[0], fleet.endpoints, tmp_path / "state",
                                commands=TEST_COMMANDS, shadow=FAST_SHADOW)
        cfg = dataclasses.replace(single, nats=NatsOptions(servers=tuple(nats_cluster.urls), connect_timeout_s=1.0))
        gw = with_services(Gateway(cfg))
        commands = next(e for e in gw.services if isinstance(e, CommandService))
        shadow = next(e for e in gw.services if isinstance(e, ShadowService))
        emitted: list[str] = []  # Nats-Msg-Id of every event the twins emitted, in order

        def record(ev: Event) -> None:
            if not ev.internal:  # internal events (param_value, repeated status text) are never published
                emitted.append(ev.msg_id)

        for twin in gw.twins.values():
            twin.subscribe(record)

        probes = 0
        stop_chatter = anyio.Event()

        async def chatter() -> None:
            """Events from both vehicles until told to stop: probes with known text, real mode changes."""
            nonlocal probes
            modes = ("ALT_HOLD", "STABILIZE")
            while not stop_chatter.is_set():
                vid = VIDS[probes % 2]
                gw.twins[vid].emit("statustext", severity=4, severity_name="WARNING", text=f"{PROBE}{probes}")
                if probes % 10 == 0:  # VID-002's mode over MAVLink: the gateway sees it and emits mode_changed
                    fleet.vehicles[1].set_mode(modes[(probes // 10) % 2], reason="rc")
                probes += 1
                await anyio.sleep(PROBE_INTERVAL_S)

        async with anyio.create_task_group() as tg, CommandClient(cluster_nc, ENV, issuer="pytest") as cc:
            tg.start_soon(gw.run)
            try:
                with anyio.fail_after(30):
                    await gw.ready.wait()
                    await shadow.started.wait()
                    await wait_for(lambda: len(commands.lanes) == len(VIDS) and all(
                        loop.binds for loop in commands.lanes.values()), 30)
                # The command path works before the failure.
                res = await cc.call("VID-001", "set_mode", {"mode": "ALT_HOLD"}, cmd_id=BASELINE_CMD_ID, timeout_s=20)
                assert res.accepted, res
                tg.start_soon(chatter)
                await wait_for_async(lambda: last_event(cluster_nc, "VID-002", "statustext"), 20, 0.2, what="probes stored before the kill", ignore=(Exception,))

                # Kill the node leading TWIN_EVENTS.
                async def leader() -> str:
                    inf = await js.stream_info(EVENTS_STREAM)
                    assert inf.cluster is not None and inf.cluster.leader in nats_cluster.names
                    return inf.cluster.leader

                victim_name = await retrying(leader, what="TWIN_EVENTS leader")
                victim = nats_cluster.node_named(victim_name)
                nc_gw = gw.publisher.nc
                gw_on_victim = nc_gw is not None and nc_gw.connected_url is not None and \
                    nc_gw.connected_url.port == victim.port
                await anyio.to_thread.run_sync(lambda: victim.stop(kill=True))
                t_kill = time.monotonic()
                emitted_at_kill, probes_at_kill = len(emitted), probes

                # During the outage: a command and a desired document, both served by the surviving quorum.
                await retrying(lambda: cc.publish("VID-001", "set_mode", {"mode": "STABILIZE"}, cmd_id=OUTAGE_CMD_ID),
                               what="publish outage command")
                desired_key = shadow_key(ENV, "VID-001", "desired")
                rev = await retrying(lambda: kv.put(desired_key, json.dumps({"params": {"RTL_ALT": 2345}}).encode()),
                                     what="put desired")

                async def outage_result() -> dict[str, Any] | None:
                    d = await last_event(cluster_nc, "VID-001", "cmd_result")
                    return d if d and d.get("cmd_id") == OUTAGE_CMD_ID else None

                result = await wait_for_async(outage_result, 40, 0.2, what="cmd_result of the outage command", ignore=(Exception,))
                assert result["result"] == "accepted", result

                async def converged() -> dict[str, Any] | None:
                    e = await kv.get(shadow_key(ENV, "VID-001", "reported"))
                    rep: dict[str, Any] = json.loads(e.value or b"null") or {}
                    return rep if rep.get("desired_revision") == rev and rep.get("converged") else None

                reported = await wait_for_async(converged, 40, 0.2, what="outage desired converged", ignore=(Exception,))
                assert reported["params"] == {"RTL_ALT": 2345}
                assert fleet.vehicles[0].params["RTL_ALT"] == 2345.0

                # Events emitted after the kill are stored by the new leader while the node is still down.
                async def stored_after_kill() -> bool:
                    nums = [_probe_number(await last_event(cluster_nc, vid, "statustext")) for vid in VIDS]
                    return min(nums) > probes_at_kill + 10

                await wait_for_async(stored_after_kill, 40, 0.2, what="probes emitted after the kill stored", ignore=(Exception,))
                inf = await retrying(lambda: js.stream_info(EVENTS_STREAM), what="info during outage")
                assert inf.cluster is not None and inf.cluster.leader not in (None, victim_name)
                assert victim.proc is None, "the killed node is running again"
                outage_s = time.monotonic() - t_kill
                in_outage = emitted[emitted_at_kill:]

                # Bring the node back; state publishing resumes, events keep flowing.
                state_before = {vid: await retrying(lambda v=vid: last_state_seq(cluster_nc, v),  # type: ignore[misc]
                                                    what="state seq") for vid in VIDS}
                await anyio.to_thread.run_sync(victim.start)
                probes_at_restart = probes
                for vid in VIDS:
                    await wait_for_async(lambda v=vid: _newer(last_state_seq(cluster_nc, v), state_before[v]), 30, 0.2, what=f"{vid} state after the restart", ignore=(Exception,))  # type: ignore[misc]
                await wait_for(lambda: probes >= probes_at_restart + 20, 20)
                stop_chatter.set()
                last_probe = f"{PROBE}{probes - 1}"
                await wait_for_async(lambda: _any_text(cluster_nc, last_probe), 40, 0.2, what="last probe stored", ignore=(Exception,))
            finally:
                stop_chatter.set()
                gw.request_stop("test done")
        # The gateway has stopped: gateway_stopped was emitted and the spool drained.

    assert gw.spool.depth == 0
    stored = await stream_events(cluster_nc)
    ids = [mid for _, mid, _ in stored]
    assert all(ids), "an event without Nats-Msg-Id"
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    assert not dupes, f"duplicate events in TWIN_EVENTS: {dupes[:10]}"
    assert len(emitted) == len(set(emitted))
    cmd_results = {f"VID-001:cmd_result:{c}" for c in (BASELINE_CMD_ID, OUTAGE_CMD_ID)}
    missing = set(emitted) - set(ids)
    extra = set(ids) - set(emitted) - cmd_results
    assert not missing and not extra, f"missing {sorted(missing)[:10]}, unexpected {sorted(extra)[:10]}"
    assert cmd_results <= set(ids)
    # Probe texts: each one exactly once, none lost across the failover.
    texts = sorted(_probe_number(d) for s, _, d in stored if s.endswith(".evt.statustext") and _probe_number(d) >= 0)
    assert texts == list(range(probes))
    # Events from the vehicles' real MAVLink traffic were emitted during the outage too (VID-002's mode changes).
    assert sum(1 for mid in in_outage if mid.startswith("VID-002:mode_changed:")) >= 2, in_outage
    assert sum(1 for _, mid, _ in stored if mid == f"VID-001:cmd_result:{OUTAGE_CMD_ID}") == 1
    outage_results = [d for s, _, d in stored if s.endswith(".evt.cmd_result") and d.get("cmd_id") == OUTAGE_CMD_ID]
    assert [d["result"] for d in outage_results] == ["accepted"]
    # The vehicle executed each command once (no replay from a redelivery across the failover).
    assert sum(1 for e in fleet.vehicles[0].executions if e.command == SET_MODE) == 2
    print(f"\nfailover: victim={victim_name} gateway_on_victim={gw_on_victim} outage_s={outage_s:.1f} "
          f"events={len(ids)} emitted_in_outage={len(in_outage)} probes={probes} "
          f"event_publish_errors={_sample(gw, 'mavjet_publishes_total', kind='event', result='error'):.0f} "
          f"cmd_dispositions={commands.lanes['VID-001'].dispositions} total_s={time.monotonic() - t_start:.1f}")


def _sample(gw: Gateway, name: str, **labels: str) -> float:
    return gw.metrics.registry.get_sample_value(name, labels) or 0.0


async def _newer(seq: Awaitable[int], than: int) -> bool:
    return await seq > than


def _probe_number(data: dict[str, Any] | None) -> int:
    text = str((data or {}).get("text", ""))
    return int(text[len(PROBE):]) if text.startswith(PROBE) else -1


async def _any_text(nc: Client, text: str) -> bool:
    for vid in VIDS:
        d = await last_event(nc, vid, "statustext")
        if d is not None and d.get("text") == text:
            return True
    return False
