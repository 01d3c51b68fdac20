"""`mavjet mission get VID`: what the vehicle holds, read back through its gateway, written as a `.plan`."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from nats.aio.client import Client

from mavjet.drivers.mavlink.plan import parse_plan
from mavjet.ops.natsserver import NatsServer
from tests.support.commands import ENV, command_rig

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "sim" / "plans" / "demo.plan"


def mavjet(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mavjet.ops", *args, "--nats", url, "--env", ENV],
                          capture_output=True, text=True, timeout=90, check=False)


async def test_mission_get_writes_what_the_vehicle_holds(provisioned: Client, nats_server: NatsServer,
                                                         tmp_path: Path) -> None:
    async with command_rig(provisioned, nats_server.url, tmp_path / "state") as rig:
        await rig.link_known("VID-001")
        put = await asyncio.to_thread(mavjet, nats_server.url, "mission", "put", str(DEMO), "--json")
        assert put.returncode == 0, put.stderr
        up = await rig.call("VID-001", "mission_upload", {"object": "missions/demo.plan"})
        assert up.accepted, up
        out = tmp_path / "back.plan"
        got = await asyncio.to_thread(mavjet, nats_server.url, "mission", "get", "VID-001", "-o", str(out), "--json")
        assert got.returncode == 0, got.stderr
        summary = json.loads(got.stdout)
        sent, back = parse_plan(DEMO.read_bytes()), parse_plan(out.read_bytes())
        # The same mission came back (the gateway's own digest of the items, as `mission_upload` verified it).
        assert len(back.mission) == len(sent.mission), (back.mission, sent.mission)
        assert summary["count"] == up.data["count"], (summary, up.data)
        # Item 0 is home: the vehicle's own, not the plan's planned home.
        assert [(i.command, round(i.x / 1e7, 5), round(i.y / 1e7, 5), round(i.z, 1)) for i in back.mission[1:]] == \
            [(i.command, round(i.x / 1e7, 5), round(i.y / 1e7, 5), round(i.z, 1)) for i in sent.mission[1:]]
        assert summary["object"].startswith("readback/VID-001/") and summary["file"] == str(out)
        # An unknown vehicle: one line, exit 2, nothing written.
        bad = await asyncio.to_thread(mavjet, nats_server.url, "mission", "get", "VID-999", "-o", str(tmp_path / "x"))
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
        assert not (tmp_path / "x").exists()
