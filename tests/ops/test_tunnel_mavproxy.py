"""MAVProxy from PyPI as the operator's ground station, through `mavjet tunnel` and NATS, on a sim vehicle.

MAVProxy runs headless: its console reads commands from a pipe (no
`--non-interactive`, which stops it reading them) and prints to stdout.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import anyio
import pytest
from anyio.abc import Process
from nats.aio.client import Client

from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.gateway.daemon import Gateway
from mavjet.ops.natsserver import NatsServer
from mavjet.sim.fleet import SimConfig, SimFleet
from tests.gateway.test_routes import _free_udp_port
from tests.support import ENV, gateway_config, running, wait_for_async

MAVPROXY = Path(sys.executable).parent / "mavproxy.py"
MAVJET = Path(sys.executable).parent / "mavjet"

pytestmark = pytest.mark.skipif(not MAVPROXY.exists(), reason="MAVProxy is not installed (pip install mavjet[dev])")


async def _is_guided(gw: Gateway) -> bool:
    return gw.twins["VID-001"].model.mode == "GUIDED"


async def _out_of_boot(gw: Gateway) -> bool:
    return (gw.twins["VID-001"].model.system_status or 0) >= mavlink2.MAV_STATE_STANDBY


class Console:
    """A process's stdout, read as it comes, searched for expected lines."""

    def __init__(self, proc: Process) -> None:
        self.proc = proc
        self.text = ""

    async def expect(self, needle: str, timeout_s: float = 20.0) -> None:
        assert self.proc.stdout is not None
        with anyio.fail_after(timeout_s):
            while needle not in self.text:
                self.text += (await self.proc.stdout.receive()).decode(errors="replace")

    async def expect_count(self, needle: str, n: int, timeout_s: float = 20.0) -> None:
        assert self.proc.stdout is not None
        with anyio.fail_after(timeout_s):
            while self.text.count(needle) < n:
                self.text += (await self.proc.stdout.receive()).decode(errors="replace")

    async def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        await self.proc.stdin.send(line.encode() + b"\n")


@asynccontextmanager
async def mavproxy_through_tunnel(url: str, port: int, tmp_path: Path) -> AsyncIterator[Console]:
    """`mavjet tunnel VID-001` listening on `port` and MAVProxy connected to it; both stopped at the end."""
    tunnel = await anyio.open_process(
        [str(MAVJET), "tunnel", "VID-001", "--listen", f"udp:127.0.0.1:{port}", "--nats", url,
         "--env", ENV], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    mavproxy = await anyio.open_process(
        [sys.executable, str(MAVPROXY), "--master", f"udpout:127.0.0.1:{port}", "--nowait",
         "--state-basedir", str(tmp_path / "mavproxy"), "--default-modules", "link,param,mode,cmdlong"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        yield Console(mavproxy)
    finally:
        for proc in (mavproxy, tunnel):
            proc.terminate()
            with anyio.move_on_after(5):
                await proc.wait()
            if proc.returncode is None:
                proc.kill()
            await proc.aclose()


async def test_mavproxy_through_the_tunnel(provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=4.0)) as fleet:
        await mavproxy_changes_mode_through_the_tunnel(fleet.endpoints, nats_server.url, tmp_path)


async def mavproxy_changes_mode_through_the_tunnel(endpoints: list[str], url: str, tmp_path: Path) -> None:
    """MAVProxy on the operator's side of `mavjet tunnel` sees VID-001's heartbeats and a parameter, and changes
    its mode to GUIDED, while the gateway serves the vehicle (also the SITL tier's scenario, tests/sitl)."""
    cfg = replace(gateway_config(url, endpoints, tmp_path / "state"), tunnel=True)
    port = _free_udp_port()
    async with running(Gateway(cfg)) as gw:
        # Out of BOOT first: ArduPilot reverts a mode set while it boots (docs/sim.md).
        await wait_for_async(lambda: _out_of_boot(gw), timeout_s=60)
        async with mavproxy_through_tunnel(url, port, tmp_path) as console:
            await console.expect("Detected vehicle 1:1")  # its heartbeats through the tunnel
            await console.send("param fetch MAV_SYSID")
            await console.expect("MAV_SYSID = 1")
            for attempt in range(1, 11):  # refused until the vehicle's position estimate is good
                await console.send("mode GUIDED")
                await console.expect_count("Got COMMAND_ACK: DO_SET_MODE: ", attempt)
                if "DO_SET_MODE: ACCEPTED" in console.text:
                    break
                await anyio.sleep(0.5)
            await console.expect("Mode GUIDED")
            # The gateway, serving the vehicle the whole time, saw the ground station's mode change.
            await wait_for_async(lambda: _is_guided(gw), timeout_s=5)
