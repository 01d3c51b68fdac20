"""Shaping on a real thin uplink: the gateway's NATS connection through a 64 kbit/s, 150 ms proxy.

Two sim vehicles stream full telemetry (more than the link carries) while a
log download uploads to TWIN_LOGS; failsafe events are injected and commands
sent. Every failsafe and every command result arrives, the log is stored,
and state was decimated to make room. Counts, not times: how fast is
`mavjet bench uplink`'s to show.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
from nats.aio.client import Client
from nats.aio.msg import Msg

from mavjet.benchmarks.linkproxy import LinkProfile, LinkProxy
from mavjet.contract.envelope import unpack
from mavjet.contract.subjects import event_filter
from mavjet.gateway.commands.logs import LogDownloadConfig, LogDownloadService
from mavjet.gateway.daemon import Gateway
from mavjet.gateway.publish.uplink import Level
from mavjet.ops.natsserver import NatsServer
from mavjet.sim.fleet import SimConfig
from tests.support.commands import ENV, command_rig
from tests.support.wait import wait_for

FAILSAFES = 6
COMMANDS = 3


def with_logs(gw: Gateway) -> None:
    gw.services.append(LogDownloadService(LogDownloadConfig(progress_interval_s=1.0, stall_timeout_s=60)))


async def test_results_and_failsafes_arrive_while_a_log_and_telemetry_compete(
        provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    seen: list[tuple[str, dict[str, Any]]] = []

    async def on_event(msg: Msg) -> None:
        seen.append((msg.subject.rsplit(".", 1)[-1], unpack(msg.data).data))

    await provisioned.subscribe(event_filter(ENV), cb=on_event)  # on the server's side of the link
    profile = LinkProfile(rate_bps=64_000, delay_s=0.075)
    sim = SimConfig(vehicles=2, base_port=0, speedup=5.0)
    async with LinkProxy(nats_server.port, profile) as proxy, \
            command_rig(provisioned, f"nats://127.0.0.1:{proxy.port}", tmp_path / "state", sim=sim,
                        configure=with_logs) as rig:
        uplink = rig.gw.publisher.uplink
        vids = list(rig.gw.twins)
        levels: set[Level] = set()
        started = await rig.client.call(vids[0], "log_download", {"log": "1"}, timeout_s=60)
        assert str(started.result) == "accepted", started
        results: list[str] = []

        async def command(vid: str) -> None:
            r = await rig.client.call(vid, "set_mode", {"mode": rig.gw.twins[vid].telemetry.mode or "STABILIZE"},
                                      timeout_s=60)
            results.append(str(r.result))

        async with anyio.create_task_group() as tg:
            for i in range(FAILSAFES):
                rig.gw.twins[vids[i % 2]].emit("failsafe", reason="test", test_seq=i)
                if i < COMMANDS:
                    tg.start_soon(command, vids[i % 2])
                levels.add(uplink.level)
                await anyio.sleep(0.5)

        def failsafe_seqs() -> set[int]:
            return {int(d["test_seq"]) for t, d in seen if t == "failsafe" and "test_seq" in d}

        def done() -> bool:
            levels.add(uplink.level)
            return len(failsafe_seqs()) == FAILSAFES and any(t == "log_downloaded" for t, _ in seen)

        await wait_for(done, timeout_s=90, interval_s=0.2, what="every failsafe and the stored log")
        assert failsafe_seqs() == set(range(FAILSAFES))  # none lost
        assert results == ["accepted"] * COMMANDS
        assert not [d for t, d in seen if t == "log_download_failed"]
        assert uplink.shed > 0 and max(levels) > Level.NORMAL  # state was decimated to make room
        assert proxy.connections == 1  # the link never dropped
