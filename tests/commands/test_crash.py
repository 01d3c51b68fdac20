"""Effectively once across a SIGKILL: the vehicle accepted, the ledger has it, the ack never went out."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from nats.aio.client import Client

from drivers.mavlink.dialect import mavlink2
from gateway.commands.executor import CRASH_ENV
from gateway.ops.client import CommandClient
from gateway.ops.natsserver import NatsServer
from sim.fleet import SimConfig, SimFleet
from tests.commands.conftest import ENV, cmd_results, ready_to_fly

SET_MODE = mavlink2.MAV_CMD_DO_SET_MODE
CONFIG = """
[commands]
ack_wait_s = 2.0
backoff_s = []
max_deliver = 10
in_progress_interval_s = 0.5
nak_delay_s = 0.3
fetch_timeout_s = 1.0
ack_timeout_s = 0.5
retries = 2

[link]
heartbeat_timeout_s = 2.0
backoff_initial_s = 0.1
backoff_max_s = 0.5
"""


async def start_gateway(url: str, endpoint: str, tmp_path: Path, log_name: str, *, crash_on: str | None = None
                        ) -> asyncio.subprocess.Process:
    cfg = tmp_path / "gateway.toml"
    cfg.write_text(CONFIG)
    env = dict(os.environ)
    env.pop(CRASH_ENV, None)
    if crash_on:
        env[CRASH_ENV] = crash_on
    args = [sys.executable, "-m", "gateway", "gateway", "--config", str(cfg), "--nats", url, "--env", ENV,
            "--state-dir", str(tmp_path / "state"), "--instance", "proc-gw", "--vehicle", f"VID-001={endpoint}"]
    with (tmp_path / log_name).open("wb") as log:
        return await asyncio.create_subprocess_exec(*args, stdout=log, stderr=log, env=env)


async def stop(proc: asyncio.subprocess.Process) -> int:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(20):
                await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode


async def test_sigkill_after_accept_before_ack_does_not_execute_twice(
    provisioned: Client, nats_server: NatsServer, tmp_path: Path
) -> None:
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=5.0)) as fleet:
        v = fleet.vehicles[0]
        await ready_to_fly(fleet)
        proc = await start_gateway(nats_server.url, fleet.endpoints[0], tmp_path, "gw1.log", crash_on="set_mode")
        try:
            async with CommandClient(provisioned, ENV, issuer="pytest") as client:
                # Only a ready gateway answers: use a harmless command to know it is consuming.
                first = await client.call("VID-001", "param_get", {"name": "RTL_ALT"}, timeout_s=40)
                assert first.accepted, first
                cmd_id = await client.publish("VID-001", "set_mode", {"mode": "GUIDED"})
                async with asyncio.timeout(20):
                    rc = await proc.wait()
                assert rc == -signal.SIGKILL, (tmp_path / "gw1.log").read_text()[-2000:]
                # The vehicle executed it; the message is still in TWIN_CMD, unacked; no result yet.
                assert sum(e.command == SET_MODE for e in v.executions) == 1
                assert v.mode == "GUIDED"
                assert client.result(cmd_id) is None
                info = await provisioned.jetstream().stream_info("TWIN_CMD")
                assert info.state.messages == 1

                proc = await start_gateway(nats_server.url, fleet.endpoints[0], tmp_path, "gw2.log")
                r = await client.wait(cmd_id, 40)
                assert r.accepted, r
                assert r.data["deliveries"] == 1  # the result recorded before the crash, re-spooled as is
                # Redelivered and acked without a second execution.
                assert sum(e.command == SET_MODE for e in v.executions) == 1
                info = await provisioned.jetstream().stream_info("TWIN_CMD")
                assert info.state.messages == 0
        finally:
            rc2 = await stop(proc)
        assert rc2 == 0, (tmp_path / "gw2.log").read_text()[-2000:]
    results = [d for d in await cmd_results(provisioned) if d["cmd_id"] == cmd_id]
    assert len(results) == 1 and results[0]["result"] == "accepted"
    log2 = (tmp_path / "gw2.log").read_text()
    assert "command_duplicate" in log2
