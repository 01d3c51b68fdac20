"""The daemon as a process: SIGTERM drains and exits 0; sd_notify READY is sent; its process-wide settings."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import BinaryIO

from nats.aio.client import Client

from mavjet.contract.natsconn import open_client
from mavjet.ops.natsserver import NatsServer
from mavjet.sim.fleet import SimConfig, SimFleet
from tests.support import ENV, collect_events, wait_for_async


def _open_log(path: Path) -> BinaryIO:
    return path.open("wb")


async def test_sigterm_stops_intake_drains_and_exits_zero(
    provisioned: Client, nats_server: NatsServer, tmp_path: Path
) -> None:
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify_path = str(tmp_path / "notify.sock")
    notify.bind(notify_path)
    notify.setblocking(False)
    async with SimFleet(SimConfig(vehicles=2, base_port=0, speedup=4.0)) as fleet:
        args = [sys.executable, "-m", "mavjet.ops", "gateway", "--nats", nats_server.url, "--env", ENV,
                "--state-dir", str(tmp_path / "state"), "--instance", "proc-gw"]
        for i, ep in enumerate(fleet.endpoints):
            args += ["--vehicle", f"VID-00{i + 1}={ep}"]
        env = dict(os.environ, NOTIFY_SOCKET=notify_path, WATCHDOG_USEC="1000000", WATCHDOG_PID="")
        log_path = tmp_path / "gateway.log"
        with _open_log(log_path) as log_file:
            proc = await asyncio.create_subprocess_exec(*args, stdout=log_file, stderr=log_file, env=env)
        try:
            messages: list[bytes] = []

            async def got_ready_and_watchdog() -> bool:
                while True:
                    try:
                        messages.append(notify.recv(4096))
                    except BlockingIOError:
                        break
                return any(b"READY=1" in mm for mm in messages) and any(b"WATCHDOG=1" in mm for mm in messages)

            await wait_for_async(got_ready_and_watchdog, timeout_s=40)

            async def streaming() -> bool:
                info = await provisioned.jetstream().stream_info("TWIN_STATE")
                return info.state.messages > 20

            await wait_for_async(streaming, timeout_s=20)
            proc.send_signal(signal.SIGTERM)
            t0 = time.monotonic()
            async with asyncio.timeout(30):
                rc = await proc.wait()
            stop_s = time.monotonic() - t0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        err = log_path.read_bytes()
    notify.close()
    assert rc == 0, err.decode()[-2000:]
    assert stop_s < 15
    assert b"gateway_stopped" in err
    nc = await open_client(nats_server.url)
    try:
        events = await collect_events(nc)
    finally:
        await nc.close()
    stopped = [(v, d) for v, t, d, _ in events if t == "gateway_stopped"]
    assert {v for v, _ in stopped} == {"VID-001", "VID-002"}
    assert all(d["reason"] == "SIGTERM" and d["gateway"] == "proc-gw" for _, d in stopped)
    # Our own shutdown is not a lost link.
    assert not any(t == "link_lost" for _, t, _, _ in events)


def test_a_gateway_process_hands_the_gil_over_every_millisecond() -> None:
    """`tune_process` (the process entry's settings, applied once ready): the switch interval and a frozen heap."""
    code = ("import gc, sys; from mavjet.gateway.entry import tune_process; before = sys.getswitchinterval(); "
            "tune_process(); print(before, sys.getswitchinterval(), gc.get_freeze_count() > 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    before, after, frozen = out.stdout.split()
    assert float(before) == 0.005 and float(after) == 0.001 and frozen == "True"
