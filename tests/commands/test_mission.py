"""Mission upload of a real QGroundControl .plan from TWIN_BLOBS, then an AUTO flight through every item."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

from nats.aio.client import Client

from drivers.mavlink.plan import parse_plan
from gateway.natsserver import NatsServer
from sim.fleet import SimConfig
from tests.commands.conftest import ENV, command_rig, ready_to_fly
from tests.gateway.conftest import collect_events

PLAN = Path(__file__).resolve().parents[2] / "sim" / "plans" / "demo.plan"


def mission_put(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "mission", "put", *args, "--nats", url, "--env", ENV],
        capture_output=True, text=True, timeout=60, check=False,
    )


async def test_mission_put_rejects_a_broken_plan(nats_server: NatsServer, tmp_path: Path) -> None:
    bad = tmp_path / "bad.plan"
    bad.write_text(json.dumps({"fileType": "Plan", "mission": {"version": 2, "items": [{"type": "ComplexItem"}]}}))
    out = await asyncio.to_thread(mission_put, nats_server.url, str(bad))
    assert out.returncode == 2
    assert "mission.items[0].type" in out.stderr


async def test_upload_verify_and_fly_the_mission(provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    put = await asyncio.to_thread(mission_put, nats_server.url, str(PLAN), "--name", "missions/demo.plan", "--json")
    assert put.returncode == 0, put.stderr
    stored = json.loads(put.stdout)
    plan = parse_plan(PLAN.read_bytes())
    assert stored["object"] == "missions/demo.plan" and stored["digest"] == plan.mission_digest

    sim = SimConfig(vehicles=1, base_port=0, speedup=20.0)
    async with command_rig(provisioned, nats_server.url, tmp_path / "state", sim=sim) as rig:
        v = rig.vehicle("VID-001")
        missing = await rig.call("VID-001", "mission_upload", {"object": "missions/nope.plan"})
        assert missing.result == "invalid" and "no object 'missions/nope.plan'" in missing.detail
        r = await rig.call("VID-001", "mission_upload", {"object": "missions/demo.plan"})
        assert r.accepted, r
        assert r.data["digest"] == plan.mission_digest and r.data["count"] == len(plan.mission)
        assert v.missions.count(0) == len(plan.mission)

        await ready_to_fly(rig.fleet)
        for name, params in (("set_mode", {"mode": "GUIDED"}), ("arm", {}), ("mission_start", {})):
            res = await rig.call("VID-001", name, params)
            assert res.accepted, res
        nav_seqs = [it.seq for it in plan.mission if it.seq > 0 and it.command < 95]
        deadline = time.monotonic() + 45
        while not set(nav_seqs) <= set(v.reached):
            assert time.monotonic() < deadline, f"reached only {v.reached} of {nav_seqs}"
            await asyncio.sleep(0.2)
        deadline = time.monotonic() + 10
        while True:
            events = await collect_events(provisioned)
            reached = [d["seq"] for _v, t, d, _m in events if t == "mission_item_reached"]
            if set(nav_seqs) <= set(reached) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.3)
    assert set(nav_seqs) <= set(reached), (reached, nav_seqs)
    assert reached == sorted(reached)
    uploaded = [d for _v, t, d, _m in events if t == "mission_uploaded"]
    assert len(uploaded) == 1
    assert uploaded[0]["object"] == "missions/demo.plan"
    assert uploaded[0]["digest"] == plan.mission_digest and uploaded[0]["count"] == len(plan.mission)
