"""The autopilot's own words in a command's result: its status text while the command ran (`vehicle_text`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
from nats.aio.client import Client

from mavjet.ops.natsserver import NatsServer
from tests.support.commands import command_rig
from tests.support.gateway import ENV


async def test_a_refusal_carries_the_vehicles_reason_and_cmd_wait_prints_it(
        provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    async with command_rig(provisioned, nats_server.url, tmp_path / "state") as rig:
        await rig.link_known("VID-001")
        # Armed with no mission on board: the sim refuses AUTO as ArduCopter does, saying why in a STATUSTEXT.
        assert (await rig.call("VID-001", "mission_clear")).accepted
        await rig.armed_in_guided("VID-001")
        r = await rig.call("VID-001", "set_mode", {"mode": "AUTO"})
        assert r.result == "failed", r
        assert any("no mission" in t for t in r.data.get("vehicle_text", [])), r.data
        # `mavjet cmd --wait` shows the vehicle's words under the result line.
        cli = [sys.executable, "-m", "mavjet.ops", "cmd", "VID-001", "set_mode", "-p", "mode=AUTO", "--wait",
               "--nats", nats_server.url, "--env", ENV]
        done = await anyio.to_thread.run_sync(lambda: subprocess.run(cli, check=False, capture_output=True,
                                                                        text=True, timeout=60))
        assert done.returncode != 0, done.stdout + done.stderr
        lines = done.stdout.splitlines()
        assert "failed" in lines[0] and any(line.startswith("  vehicle: ") and "no mission" in line
                                            for line in lines[1:]), done.stdout
