"""Fences that protect: a verified fence from a plan is switched on (FENCE_ENABLE=1, read back) unless told not to."""

from __future__ import annotations

import json
from pathlib import Path

from nats.aio.client import Client

from mavjet.ops.natsserver import NatsServer
from tests.commands.test_mission import PLAN, put_plan
from tests.support import collect_events
from tests.support.commands import command_rig


async def test_fence_from_a_plan_is_enabled_unless_the_command_says_not(
    provisioned: Client, nats_server: NatsServer, tmp_path: Path
) -> None:
    demo = json.loads(PLAN.read_text())
    mission_only = {k: v for k, v in demo.items() if k not in ("geoFence", "rallyPoints")}
    await put_plan(provisioned, "missions/demo.plan", demo)
    await put_plan(provisioned, "missions/only.plan", mission_only)
    async with command_rig(provisioned, nats_server.url, tmp_path / "state") as rig:
        v = rig.vehicle("VID-001")
        assert v.params["FENCE_ENABLE"] == 0
        # enable_fence=false: the zones go up and are verified, the switch stays off, and the result says so.
        r = await rig.call("VID-001", "mission_upload", {"object": "missions/demo.plan", "enable_fence": False})
        assert r.accepted, r
        assert r.data["fence_count"] > 0 and r.data["fence_enabled"] is False
        assert v.params["FENCE_ENABLE"] == 0
        # The default: the verified fence is switched on and read back.
        r = await rig.call("VID-001", "mission_upload", {"object": "missions/demo.plan"})
        assert r.accepted, r
        assert r.data["fence_enabled"] is True
        assert v.params["FENCE_ENABLE"] == 1
        # A plan without a fence leaves the switch alone and reports the vehicle's state.
        r = await rig.call("VID-001", "mission_upload", {"object": "missions/only.plan"})
        assert r.accepted and r.data["fence_count"] == 0 and r.data["fence_enabled"] is True, r
        assert v.params["FENCE_ENABLE"] == 1
    events = await collect_events(provisioned)
    uploaded = [d["fence_enabled"] for _v, t, d, _m in events if t == "mission_uploaded"]
    assert uploaded == [False, True, True]
