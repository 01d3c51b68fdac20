"""Mission upload of a real QGroundControl .plan from TWIN_BLOBS, then an AUTO flight through every item."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from nats.aio.client import Client

from mavjet.contract.subjects import BLOBS_BUCKET
from mavjet.drivers.mavlink.mission import FENCE, RALLY
from mavjet.drivers.mavlink.plan import digest, parse_plan
from mavjet.ops.natsserver import NatsServer
from mavjet.sim.fleet import SimConfig
from mavjet.sim.vehicle import SimVehicle
from tests.support import collect_events
from tests.support.commands import ENV, command_rig, ready_to_fly

PLAN = Path(__file__).resolve().parents[2] / "sim" / "plans" / "demo.plan"


def mission_put(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mavjet.ops", "mission", "put", *args, "--nats", url, "--env", ENV],
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
        # The plan's geofence and rally points went up too, each read back and verified by digest.
        assert len(plan.fence) > 1 and len(plan.rally) == 1
        assert (r.data["fence_count"], r.data["fence_digest"]) == (len(plan.fence), digest(plan.fence))
        assert (r.data["rally_count"], r.data["rally_digest"]) == (len(plan.rally), digest(plan.rally))
        assert r.detail == f"{len(plan.mission)} items, {len(plan.fence)} fence items, 1 rally item, read back and verified"
        assert stored_items(v, FENCE) == item_keys(plan.fence)
        assert stored_items(v, RALLY) == item_keys(plan.rally)

        await ready_to_fly(rig.fleet)
        for name, params in (("set_mode", {"mode": "GUIDED"}), ("arm", {}), ("mission_start", {})):
            res = await rig.call("VID-001", name, params)
            assert res.accepted, res
        # ArduPilot coalesces MISSION_ITEM_REACHED: a navigation item followed at once by DO_ items is
        # reported as the last of those DO_ items (the sim now does the same).
        nav_seqs: list[int] = []
        for it in plan.mission[1:]:
            if it.command < 95:
                nav_seqs.append(it.seq)
            elif nav_seqs and nav_seqs[-1] == it.seq - 1:
                nav_seqs[-1] = it.seq
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
    assert uploaded[0]["fence_digest"] == digest(plan.fence) and uploaded[0]["fence_count"] == len(plan.fence)
    assert uploaded[0]["rally_digest"] == digest(plan.rally) and uploaded[0]["rally_count"] == len(plan.rally)


def item_keys(items: Iterable[Any]) -> list[tuple[Any, ...]]:
    """What identifies a fence or rally item on the vehicle (independent of the digest's canonical form)."""
    return [(it.seq, it.frame, it.command, it.x, it.y, round(it.param1, 3), round(it.z, 3)) for it in items]


def stored_items(v: SimVehicle, mission_type: int) -> list[tuple[Any, ...]]:
    return item_keys(v.missions.items(mission_type))


async def put_plan(nc: Client, name: str, doc: dict[str, Any]) -> None:
    store = await nc.jetstream().object_store(BLOBS_BUCKET)
    await store.put(name, json.dumps(doc).encode())


async def test_plan_without_fence_keeps_the_vehicle_fence_and_a_refused_rally_is_rejected(
    provisioned: Client, nats_server: NatsServer, tmp_path: Path
) -> None:
    demo = json.loads(PLAN.read_text())
    plan = parse_plan(PLAN.read_bytes())
    mission_only = {k: v for k, v in demo.items() if k not in ("geoFence", "rallyPoints")}
    lat, lon, _alt = demo["rallyPoints"]["points"][0]
    too_many_rally = {**mission_only, "rallyPoints": {"version": 2, "points": [[lat, lon, 30]] * 701}}
    await put_plan(provisioned, "missions/demo.plan", demo)
    await put_plan(provisioned, "missions/only.plan", mission_only)
    await put_plan(provisioned, "missions/rally701.plan", too_many_rally)
    async with command_rig(provisioned, nats_server.url, tmp_path / "state") as rig:
        v = rig.vehicle("VID-001")
        assert (await rig.call("VID-001", "mission_upload", {"object": "missions/demo.plan"})).accepted
        r = await rig.call("VID-001", "mission_upload", {"object": "missions/only.plan"})
        assert r.accepted, r
        assert (r.data["fence_count"], r.data["fence_digest"], r.data["rally_count"], r.data["rally_digest"]) == \
            (0, None, 0, None)
        assert r.detail == f"{len(plan.mission)} items, read back and verified"
        # A plan without a geofence or rally points leaves the vehicle's alone.
        assert stored_items(v, FENCE) == item_keys(plan.fence) and stored_items(v, RALLY) == item_keys(plan.rally)
        # The vehicle refuses 701 rally points (no space): the command is rejected, naming the list.
        r = await rig.call("VID-001", "mission_upload", {"object": "missions/rally701.plan"})
        assert r.result == "rejected", r
        assert r.detail == "mission_upload: rally rejected: MAV_MISSION_RESULT 4 (no_space)", r.detail
        assert stored_items(v, RALLY) == item_keys(plan.rally)
