"""A paused owner (SIGSTOP past the TTL) wakes fenced: not one frame that acts leaves it after SIGCONT.

Two `mavjet gateway` processes for one sim vehicle on a real nats-server. The
owner reaches the vehicle through a relay that records every frame it sends.
It is stopped while it retransmits a command the vehicle never ACKs (the
vehicle acted, the ACKs are lost), so on waking it has every reason to send
again; the standby takes the vehicle over meanwhile and settles the command
from the vehicle's state.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

from nats.aio.client import Client

from mavjet.contract.subjects import LEASES_BUCKET, lease_key
from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.drivers.mavlink.router import FrameSplitter
from mavjet.gateway.commands.recovery import CONFIRMED_DETAIL
from mavjet.ops.client import CommandClient
from mavjet.ops.natsserver import NatsServer
from mavjet.sim.fleet import SimConfig, SimFleet
from tests.support.commands import ready_to_fly
from tests.support.gateway import ENV
from tests.support.wait import wait_for, wait_for_async

VID = "VID-001"
CONFIG = """
[commands]
ack_wait_s = 4.0
backoff_s = []
ack_timeout_s = 0.5
retries = 19
nak_delay_s = 0.3
fetch_timeout_s = 1.0
in_progress_interval_s = 0.5
"""
# What a gateway that does not own the vehicle may still send (drivers/mavlink/link.py `passes_standby`).
HARMLESS = {mavlink2.MAVLINK_MSG_ID_HEARTBEAT, mavlink2.MAVLINK_MSG_ID_REQUEST_DATA_STREAM}


class RecordingRelay:
    """TCP relay to the vehicle; every whole frame the gateway sends is kept with its time (msgid, command)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.sent: list[tuple[float, int, int | None]] = []
        self.server: asyncio.Server | None = None
        self.port = 0
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return f"tcp:127.0.0.1:{self.port}"

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        for w in self._writers:
            w.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers += [writer, up_w]
        await asyncio.gather(self._up(reader, up_w), self._down(up_r, writer), return_exceptions=True)

    async def _up(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        splitter = FrameSplitter()
        while data := await reader.read(65536):
            now = time.monotonic()
            for frame in splitter.feed(data):
                if frame[0] != 0xFD:
                    continue
                msgid = frame[7] | (frame[8] << 8) | (frame[9] << 16)
                command = None
                if msgid == mavlink2.MAVLINK_MSG_ID_COMMAND_LONG:
                    payload = frame[10:10 + frame[1]].ljust(33, b"\0")
                    command = struct.unpack_from("<H", payload, 28)[0]
                self.sent.append((now, msgid, command))
            writer.write(data)
            await writer.drain()

    @staticmethod
    async def _down(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()


def start_gateway(url: str, endpoint: str, tmp_path: Path, name: str) -> subprocess.Popen[bytes]:
    cfg = tmp_path / f"{name}.toml"
    cfg.write_text(CONFIG)
    with (tmp_path / f"{name}.log").open("wb") as log:  # the child keeps its own descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "mavjet.ops", "gateway", "--config", str(cfg), "--nats", url, "--env", ENV,
             "--state-dir", str(tmp_path / name), "--instance", name, "--vehicle", f"{VID}={endpoint}",
             "--log-json"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def logged(tmp_path: Path, name: str, event: str) -> list[dict[str, object]]:
    out = []
    for line in (tmp_path / f"{name}.log").read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("event") == event:
            out.append(rec)
    return out


async def test_paused_owner_sends_nothing_that_acts_after_it_wakes(
        provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    js = provisioned.jetstream()

    async def holder() -> str | None:
        try:
            msg = await js.get_msg(f"KV_{LEASES_BUCKET}", subject=f"$KV.{LEASES_BUCKET}.{lease_key(ENV, VID)}")
        except Exception:
            return None
        return str(json.loads(msg.data or b"{}").get("instance")) if msg.data else None

    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=5.0)) as fleet:
        v = fleet.vehicles[0]
        await ready_to_fly(fleet)
        relay = RecordingRelay(int(fleet.endpoints[0].rsplit(":", 1)[1]))
        via_relay = await relay.start()
        a = start_gateway(nats_server.url, via_relay, tmp_path, "gw-a")
        b: subprocess.Popen[bytes] | None = None
        try:
            await wait_for_async(lambda: _is(holder, "gw-a"), timeout_s=40, interval_s=0.2)
            b = start_gateway(nats_server.url, fleet.endpoints[0], tmp_path, "gw-b")
            await wait_for(lambda: bool(logged(tmp_path, "gw-b", "vehicle_served_elsewhere_standby")), timeout_s=40)
            async with CommandClient(provisioned, ENV, issuer="pytest") as client:
                await asyncio.sleep(1.0)  # the owner's consumer is bound
                v.drop_next("COMMAND_ACK", 1000)  # the vehicle acts; the owner never hears back, so it retries
                cmd_id = await client.publish(VID, "set_mode", {"mode": "GUIDED"})
                await wait_for(lambda: sum(c == mavlink2.MAV_CMD_DO_SET_MODE for _, _, c in relay.sent) >= 2,
                               timeout_s=20)
                os.kill(a.pid, signal.SIGSTOP)
                await wait_for_async(lambda: _is(holder, "gw-b"), timeout_s=15, interval_s=0.2)
                v._drop_out.clear()
                woke = time.monotonic()
                os.kill(a.pid, signal.SIGCONT)
                await asyncio.sleep(4.0)  # the woken owner's retry timers all fire in this time
                after = [(msgid, cmd) for t, msgid, cmd in relay.sent if t >= woke]
                acting = [(m, c) for m, c in after
                          if m not in HARMLESS and c != mavlink2.MAV_CMD_SET_MESSAGE_INTERVAL]
                assert after, "the woken gateway's link must still be alive (heartbeats), or this proves nothing"
                assert acting == [], acting
                result = await client.wait(cmd_id, 30, vid=VID)
                assert result.accepted and result.detail == CONFIRMED_DETAIL, result
            assert logged(tmp_path, "gw-a", "lease_lost") or logged(tmp_path, "gw-a", "lease_fenced")
            # It did try (its retry timer fired on waking): the link refused, and the delivery went back.
            assert logged(tmp_path, "gw-a", "command_handed_back")
        finally:
            for p in (a, b):
                if p is not None:
                    os.kill(p.pid, signal.SIGCONT)
                    p.terminate()
                    try:
                        p.wait(timeout=20)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait()
            await relay.close()


async def _is(holder: object, name: str) -> bool:
    got = await holder()  # type: ignore[operator]
    return bool(got == name)
