"""Effectively once across a SIGKILL: the vehicle accepted, the ledger has it, the ack never went out.

The gateway runs as a process whose NATS connection goes through a proxy in
this test. The proxy stops forwarding the gateway's traffic the moment it
hands the gateway the command under test, so the gateway executes it and
writes its ledger, but its ack and its `cmd_result` never reach the server.
The test waits for the ledger row and kills the gateway: the worst moment
for a crash, reproduced without any hook in the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sqlite3
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

from nats.aio.client import Client
from nats.js.api import StreamInfo

from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.gateway.commands.ledger import IN_FLIGHT, outcome_log_path, read_outcome_log
from mavjet.ops.client import CommandClient
from mavjet.ops.natsserver import NatsServer
from mavjet.sim.fleet import SimConfig, SimFleet
from tests.support.commands import ENV, cmd_results, ready_to_fly

SET_MODE = mavlink2.MAV_CMD_DO_SET_MODE
# The gateway is cut from NATS right after a delivery: with ownership it could not even write the shared
# in-flight row (and would be fenced), so these tests measure the single gateway's own ledger, as before
# ownership; tests/ownership/test_failover.py covers the same crash across two gateways.
CONFIG = """
ownership = false
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


class FreezingProxy:
    """A TCP proxy to nats-server that drops everything its clients send once `trigger` was delivered to them."""

    def __init__(self, upstream: tuple[str, int], trigger: bytes) -> None:
        self.upstream = upstream
        self.trigger = trigger
        self.frozen = asyncio.Event()
        self.port = 0

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, to_client: bool) -> None:
        tail = b""
        try:
            while data := await reader.read(65536):
                if to_client:
                    if self.trigger in tail + data:
                        self.frozen.set()  # before the client can answer what it is about to receive
                    tail = data[-len(self.trigger):]
                elif self.frozen.is_set():
                    continue  # the client's ack, result and pings go nowhere
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(*self.upstream)
        await asyncio.gather(self._pump(server_r, client_w, to_client=True),
                             self._pump(client_r, server_w, to_client=False))

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[str]:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        try:
            yield f"nats://127.0.0.1:{self.port}"
        finally:
            server.close()


def ledger_result(path: Path, cmd_id: str) -> str | None:
    """The gateway's ledger row for `cmd_id`, read as another process would (WAL allows a reader)."""
    if not path.exists():
        return None
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        row = db.execute("SELECT result FROM ledger WHERE vid = 'VID-001' AND cmd_id = ?", (cmd_id,)).fetchone()
    except sqlite3.OperationalError:  # not created yet
        return None
    finally:
        db.close()
    if row is None or row[0] == IN_FLIGHT:  # a final row may still be in the outcome log only
        logged = [e.result for e in read_outcome_log(outcome_log_path(path)) if e.key == ("VID-001", cmd_id)]
        if logged:
            return logged[0]
    return None if row is None else str(row[0])


async def start_gateway(url: str, endpoint: str, tmp_path: Path, log_name: str) -> asyncio.subprocess.Process:
    cfg = tmp_path / "gateway.toml"
    cfg.write_text(CONFIG)
    args = [sys.executable, "-m", "mavjet.ops", "gateway", "--config", str(cfg), "--nats", url, "--env", ENV,
            "--state-dir", str(tmp_path / "state"), "--instance", "proc-gw", "--vehicle", f"VID-001={endpoint}"]
    with (tmp_path / log_name).open("wb") as log:
        return await asyncio.create_subprocess_exec(*args, stdout=log, stderr=log)


async def stream_drained(nc: Client, *, timeout_s: float) -> StreamInfo:
    deadline = time.monotonic() + timeout_s
    while True:
        info = await nc.jetstream().stream_info("TWIN_CMD")
        if info.state.messages == 0 or time.monotonic() > deadline:
            return info
        await asyncio.sleep(0.1)


async def stop(proc: asyncio.subprocess.Process) -> int:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 20)
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
        proxy = FreezingProxy((nats_server.host, nats_server.port), trigger=b".cmd.set_mode ")
        async with proxy.running() as proxied_url, CommandClient(provisioned, ENV, issuer="pytest") as client:
            proc = await start_gateway(proxied_url, fleet.endpoints[0], tmp_path, "gw1.log")
            try:
                # Only a ready gateway answers: use a harmless command to know it is consuming.
                first = await client.call("VID-001", "param_get", {"name": "RTL_ALT"}, timeout_s=40)
                assert first.accepted, first
                cmd_id = await client.publish("VID-001", "set_mode", {"mode": "GUIDED"})
                await asyncio.wait_for(proxy.frozen.wait(), 20)
                ledger = tmp_path / "state" / "commands.sqlite"
                deadline = time.monotonic() + 20
                while ledger_result(ledger, cmd_id) != "accepted":
                    assert time.monotonic() < deadline, (tmp_path / "gw1.log").read_text()[-2000:]
                    await asyncio.sleep(0.05)
                proc.send_signal(signal.SIGKILL)
                rc = await asyncio.wait_for(proc.wait(), 20)
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
                # The result may come from the spool before AckWait passes: wait for the redelivery.
                info = await stream_drained(provisioned, timeout_s=20)
                # Redelivered and acked without a second execution.
                assert sum(e.command == SET_MODE for e in v.executions) == 1
                assert info.state.messages == 0
            finally:
                rc2 = await stop(proc)
        assert rc2 == 0, (tmp_path / "gw2.log").read_text()[-2000:]
    results = [d for d in await cmd_results(provisioned) if d["cmd_id"] == cmd_id]
    assert len(results) == 1 and results[0]["result"] == "accepted"
    log2 = (tmp_path / "gw2.log").read_text()
    assert "command_duplicate" in log2
