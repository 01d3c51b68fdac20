"""`mavjet mission put` checks a plan as QGroundControl does; the gateway's `mission_upload` checks it again.

A real nats-server, the real CLI (a subprocess) and a simulated vehicle: a
refused plan is not stored and, stored behind the CLI's back, not uploaded;
a warned plan is stored, uploaded and its warnings are in the result; a
Mission Planner `.waypoints` file is stored as the `.plan` it becomes.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from nats.aio.client import Client

from mavjet.contract.commands import CommandName
from mavjet.contract.subjects import BLOBS_BUCKET
from mavjet.drivers.mavlink.mission import MISSION
from mavjet.drivers.mavlink.plan import parse_plan
from mavjet.drivers.mavlink.waypoints import parse_waypoints
from mavjet.gateway.stores.blobs import info
from mavjet.ops.natsserver import NatsServer
from tests.support.commands import ENV, command_rig

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "sim" / "plans" / "demo.plan"
MP_FILE = ROOT / "tests" / "drivers" / "fixtures" / "mp_survey.waypoints"
TAKEOFF = 22


def mission_put(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mavjet.ops", "mission", "put", *args, "--nats", url, "--env", ENV],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def demo() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DEMO.read_text())
    return doc


async def test_a_refused_and_a_warned_plan(provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    js = provisioned.jetstream()
    below = demo()
    below["mission"]["items"][2]["params"][6] = -10  # a waypoint 10 m below home
    refused_file = tmp_path / "below.plan"
    refused_file.write_text(json.dumps(below))
    no_takeoff = demo()
    no_takeoff["mission"]["items"] = [it for it in no_takeoff["mission"]["items"] if it["command"] != TAKEOFF]
    warned_file = tmp_path / "no_takeoff.plan"
    warned_file.write_text(json.dumps(no_takeoff))

    out = await asyncio.to_thread(mission_put, nats_server.url, str(refused_file))
    assert out.returncode == 2, out
    assert f"{refused_file}: refused: mission.items[2]: NAV_WAYPOINT at -10.0 m is below home" in out.stderr
    assert "not stored (1 refusal" in out.stderr and "Traceback" not in out.stderr
    assert await info(js, "missions/below.plan") is None

    out = await asyncio.to_thread(mission_put, nats_server.url, str(warned_file), "--json")
    assert out.returncode == 0, out.stderr
    stored = json.loads(out.stdout)
    assert stored["object"] == "missions/no_takeoff.plan"
    assert len(stored["warnings"]) == 1 and "no takeoff item" in stored["warnings"][0]
    assert "warning: no takeoff item: a copter will not start this mission from the ground" in out.stderr

    out = await asyncio.to_thread(mission_put, nats_server.url, str(MP_FILE))
    assert out.returncode == 0, out.stderr
    assert "stored missions/mp_survey.plan" in out.stdout and "converted from Mission Planner" in out.stdout
    _doc, mp_plan = parse_waypoints(MP_FILE.read_bytes())

    # The refused plan put straight into the bucket (not through `mission put`): the gateway refuses it too.
    store = await js.object_store(BLOBS_BUCKET)
    await store.put("missions/below.plan", json.dumps(below).encode())

    async with command_rig(provisioned, nats_server.url, tmp_path / "state") as rig:
        v = rig.vehicle("VID-001")
        before = v.missions.items(MISSION)
        r = await rig.call("VID-001", CommandName.MISSION_UPLOAD, {"object": "missions/below.plan"})
        assert r.result == "invalid", r
        assert "missions/below.plan refused: mission.items[2]: NAV_WAYPOINT at -10.0 m is below home" in r.detail
        assert v.missions.items(MISSION) == before  # nothing was sent

        r = await rig.call("VID-001", CommandName.MISSION_UPLOAD, {"object": "missions/no_takeoff.plan"})
        assert r.accepted, r
        assert "read back and verified; warning: no takeoff item: a copter" in r.detail
        assert r.data["warnings"] == stored["warnings"]
        plan = parse_plan(warned_file.read_bytes())
        assert r.data["digest"] == plan.mission_digest and v.missions.count(MISSION) == len(plan.mission)

        r = await rig.call("VID-001", CommandName.MISSION_UPLOAD, {"object": "missions/mp_survey.plan"})
        assert r.accepted, r
        assert r.data["digest"] == mp_plan.mission_digest and r.data["warnings"] == []
