"""Shadow scenarios against the simulator and a real ArduCopter SITL alike: desired params, mission and
geofence converge, verified by the vehicle's own read-back (the reported document says so)."""

from __future__ import annotations

import json
from typing import Any

from mavjet.contract.subjects import BLOBS_BUCKET, SHADOW_BUCKET, shadow_key
from mavjet.drivers.mavlink.fence import geofence_from_dict
from mavjet.drivers.mavlink.plan import parse_plan
from tests.sitl.peers import ARDUPILOT_NAMES, Names
from tests.sitl.scenarios import QGC_PLAN, Rig, standby
from tests.support.gateway import ENV
from tests.support.wait import wait_for_async


async def set_desired(rig: Rig, vid: str, doc: dict[str, Any]) -> int:
    kv = await rig.nc.jetstream().key_value(SHADOW_BUCKET)
    return int(await kv.put(shadow_key(ENV, vid, "desired"), json.dumps(doc).encode()))


async def converged(rig: Rig, vid: str, revision: int, timeout_s: float) -> dict[str, Any]:
    """The `reported` document once it says `revision` converged (a bounded wait)."""
    kv = await rig.nc.jetstream().key_value(SHADOW_BUCKET)
    last: list[Any] = []

    async def check() -> dict[str, Any] | None:
        try:
            rep = json.loads((await kv.get(shadow_key(ENV, vid, "reported"))).value or b"null")
        except Exception:  # not written yet
            return None
        last[:] = [rep]
        return rep if rep and rep.get("desired_revision") == revision and rep.get("converged") else None

    try:
        got: dict[str, Any] = await wait_for_async(check, timeout_s, 0.2, what=f"desired rev {revision} converged")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last reported: {last[-1] if last else None}") from None
    return got


async def shadow_params(rig: Rig, vid: str, names: Names = ARDUPILOT_NAMES) -> None:
    """desired.params converge; reported shows the values read back; param_get agrees."""
    await standby(rig, vid)
    want = names.shadow_params
    rep = await converged(rig, vid, await set_desired(rig, vid, {"params": want}), 60)
    assert rep["params"] == want and rep["delta"] == {} and rep["link"] == "up", rep
    first = next(iter(want))
    got = await rig.call(vid, "param_get", {"name": first})
    assert got.accepted and got.data["value"] == float(want[first]), got


async def shadow_mission_and_geofence(rig: Rig, vid: str) -> None:
    """desired.mission (object + digest) and desired.geofence converge: the reported digests are the desired
    ones, computed on the vehicle's read-back, and the fence is enabled."""
    await standby(rig, vid)
    plan = parse_plan(QGC_PLAN.read_bytes())
    store = await rig.nc.jetstream().object_store(BLOBS_BUCKET)
    await store.put("missions/qgc_full.plan", QGC_PLAN.read_bytes())
    m = rig.model(vid)
    await wait_for_async(_has_position(rig, vid), 60, 0.2, what="a position")
    lat, lon, d = m.lat_deg, m.lon_deg, 0.002
    fence = {
        "polygons": [{"inclusion": True,
                      "points": [[lat - d, lon - d], [lat - d, lon + d], [lat + d, lon + d], [lat + d, lon - d]]}],
        "circles": [{"inclusion": False, "center": [lat + d / 2, lon + d / 2], "radius_m": 20}],
        "max_alt_m": 80,
        "action": "land",
    }
    doc = {"mission": {"object": "missions/qgc_full.plan", "digest": plan.mission_digest}, "geofence": fence}
    rep = await converged(rig, vid, await set_desired(rig, vid, doc), 90)
    assert rep["mission"]["digest"] == plan.mission_digest, rep
    assert rep["geofence"]["digest"] == geofence_from_dict(fence).digest, rep
    assert rep["geofence"]["enabled"] is True and rep["delta"] == {}, rep
    got = await rig.call(vid, "param_get", {"name": "FENCE_ENABLE"})
    assert got.accepted and got.data["value"] == 1.0, got


def _has_position(rig: Rig, vid: str) -> Any:
    async def check() -> bool:
        m = rig.model(vid)
        return m.lat_deg is not None and m.lon_deg is not None and (m.lat_deg, m.lon_deg) != (0.0, 0.0)

    return check
