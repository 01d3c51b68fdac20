"""Mission by object + digest, and geofence: converge, verified by download and digest."""

from __future__ import annotations

from pathlib import Path

import nats.js.errors

from mavjet.contract.subjects import BLOBS_BUCKET
from mavjet.drivers.mavlink.fence import geofence_from_dict
from mavjet.drivers.mavlink.mission import FENCE, MISSION
from mavjet.drivers.mavlink.plan import digest, parse_plan
from tests.shadow.harness import Shadowed
from tests.support import wait_for

VID = "VID-001"
PLAN = Path(__file__).resolve().parents[2] / "sim" / "plans" / "demo.plan"


def vehicle_items(sh: Shadowed, mission_type: int) -> list[object]:
    return list(sh.fleet.vehicles[0].missions.items(mission_type))


async def put_plan(sh: Shadowed, name: str, data: bytes) -> None:
    js = sh.nc.jetstream()
    try:
        obs = await js.object_store(BLOBS_BUCKET)
    except nats.js.errors.BucketNotFoundError:
        obs = await js.create_object_store(BLOBS_BUCKET)
    await obs.put(name, data)


async def test_mission_by_object_and_digest(sh: Shadowed) -> None:
    data = PLAN.read_bytes()
    plan = parse_plan(data)
    await put_plan(sh, "missions/demo.plan", data)
    want = plan.mission_digest
    rev = await sh.set_desired(VID, {"mission": {"object": "missions/demo.plan", "digest": want}})
    rep = await sh.wait_converged(VID, rev)
    assert rep["mission"]["digest"] == want and rep["mission"]["object"] == "missions/demo.plan"
    # the vehicle holds exactly the plan's items (home at seq 0 is the vehicle's own)
    items = vehicle_items(sh, MISSION)
    assert len(items) == len(plan.mission)
    # a digest the object does not have: reported with the reason, nothing uploaded
    rev2 = await sh.set_desired(VID, {"mission": {"object": "missions/demo.plan", "digest": "0" * 64}})
    rep = await sh.wait_reported(VID, lambda r: r["desired_revision"] == rev2 and "mission" in r["delta"])
    assert "desired says" in rep["delta"]["mission"]["reason"]
    assert rep["mission"]["digest"] == want
    # an object that does not exist
    rev3 = await sh.set_desired(VID, {"mission": {"object": "missions/nope.plan", "digest": "1" * 64}})
    rep = await sh.wait_reported(VID, lambda r: r["desired_revision"] == rev3 and "mission" in r["delta"])
    assert "cannot read" in rep["delta"]["mission"]["reason"]


async def test_geofence_converges_and_is_verified(sh: Shadowed) -> None:
    v = sh.fleet.vehicles[0]
    lat, lon = v.lat_deg, v.lon_deg
    d = 0.002
    fence = {
        "polygons": [{"inclusion": True, "points": [[lat - d, lon - d], [lat - d, lon + d], [lat + d, lon + d], [lat + d, lon - d]]}],
        "circles": [{"inclusion": False, "center": [lat + d / 2, lon + d / 2], "radius_m": 20}],
        "max_alt_m": 80,
        "action": "land",
    }
    g = geofence_from_dict(fence)
    rev = await sh.set_desired(VID, {"geofence": fence})
    rep = await sh.wait_converged(VID, rev)
    assert rep["geofence"]["digest"] == g.digest
    assert rep["geofence"]["max_alt_m"] == 80 and rep["geofence"]["enabled"] is True
    assert v.params["FENCE_ENABLE"] == 1.0 and v.params["FENCE_ALT_MAX"] == 80.0 and v.params["FENCE_ACTION"] == 2.0
    items = v.missions.items(FENCE)
    assert len(items) == 5
    # Someone disables the fence behind the gateway's back; the periodic read back
    # (verify_interval_s, 3 s in these tests) finds and fixes it.
    v.params["FENCE_ENABLE"] = 0.0
    await wait_for(lambda: v.params["FENCE_ENABLE"] == 1.0, 15)
    assert digest(g.items()) == g.digest
