"""The KV side: concurrent writers to reported, bad documents, NATS restarts, several vehicles."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nats.aio.client import Client

from mavjet.ops.natsserver import NatsServer
from mavjet.sim.fleet import SimConfig, SimFleet
from tests.shadow.harness import Shadowed, shadowed
from tests.support import wait_for

VID = "VID-001"


async def test_concurrent_writer_to_reported_is_handled_by_revision_retry(sh: Shadowed) -> None:
    rev = await sh.set_desired(VID, {"params": {"RTL_ALT": 2100}})
    await sh.wait_converged(VID, rev)
    writer = sh.shadow.reconcilers[VID].writer
    conflicts = writer.conflicts
    # Another writer (a script, a stale gateway) overwrites reported with a record of its own.
    foreign = {"desired_revision": 1, "converged": True, "applied": {"mode": {"revision": 999, "value": "AUTO",
                                                                             "result": "accepted"}}}
    await sh.kv.put(sh.key(VID, "reported"), json.dumps(foreign).encode())
    rev2 = await sh.set_desired(VID, {"params": {"RTL_ALT": 2300}})
    rep = await sh.wait_converged(VID, rev2)
    assert writer.conflicts > conflicts
    assert rep["params"] == {"RTL_ALT": 2300} and rep["gateway"] == "test-gw"
    # the other writer's record of an applied flight-state change was merged, not lost
    assert rep["applied"]["mode"]["revision"] == 999


async def test_bad_desired_documents_are_reported_and_gateway_keeps_serving(
    provisioned: Client, nats_server: NatsServer, tmp_path: Path
) -> None:
    async with SimFleet(SimConfig(vehicles=2, base_port=0, speedup=4.0)) as fleet, \
            shadowed(provisioned, nats_server.url, fleet, tmp_path / "state") as sh:
        bad = await sh.set_desired("VID-001", b"{this is not json")
        good = await sh.set_desired("VID-002", {"params": {"RTL_ALT": 2600}})
        rep = await sh.wait_reported("VID-001", lambda r: r["desired_revision"] == bad and "$" in r["delta"])
        assert "not valid JSON" in rep["delta"]["$"]["reason"] and rep["converged"] is False
        await sh.wait_converged("VID-002", good)
        assert fleet.vehicles[1].params["RTL_ALT"] == 2600.0
        # schema errors: per field, the good field beside them still applied
        bad2 = await sh.set_desired("VID-001", {"params": {"RTL_ALT": "high", "LAND_SPEED": 70}, "rates": {"gps": 900},
                                                "mode": "WARP", "colour": "red"})
        rep = await sh.wait_reported("VID-001", lambda r: r["desired_revision"] == bad2 and "mode" in r["delta"])
        assert set(rep["delta"]) >= {"params.RTL_ALT", "rates.gps", "mode", "colour"}
        assert "unknown mode" in rep["delta"]["mode"]["reason"]
        await wait_for(lambda: fleet.vehicles[0].params["LAND_SPEED"] == 70.0)
        # and the gateway still serves: a valid document converges
        ok = await sh.set_desired("VID-001", {"params": {"LAND_SPEED": 60}})
        await sh.wait_converged("VID-001", ok)


async def test_nats_restart_during_reconciliation(
    provisioned: Client, nats_server: NatsServer, tmp_path: Path
) -> None:
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=4.0)) as fleet, \
            shadowed(provisioned, nats_server.url, fleet, tmp_path / "state") as sh:
        rev = await sh.set_desired(VID, {"params": {"RTL_ALT": 2700}})
        await sh.wait_converged(VID, rev)
        nats_server.restart()
        await wait_for(lambda: provisioned.is_connected and sh.gw.publisher.is_connected, 20)
        # The watch was re-created: a change written after the restart is picked up.
        rev2 = await sh.set_desired(VID, {"params": {"RTL_ALT": 2900}})
        await wait_for(lambda: fleet.vehicles[0].params["RTL_ALT"] == 2900.0, 30)
        await sh.wait_converged(VID, rev2, 30)
        # Server down while desired changes are impossible; the vehicle side is unaffected,
        # and on return the current value is worked from.
        nats_server.stop()
        fleet.vehicles[0].params["RTL_ALT"] = 1500.0  # drift while NATS is away
        nats_server.start()
        await wait_for(lambda: sh.gw.publisher.is_connected, 20)
        await wait_for(lambda: fleet.vehicles[0].params["RTL_ALT"] == 2900.0, 30)


async def test_several_vehicles_at_once(provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    n = 4
    async with SimFleet(SimConfig(vehicles=n, base_port=0, speedup=4.0)) as fleet, \
            shadowed(provisioned, nats_server.url, fleet, tmp_path / "state") as sh:
        revs: dict[str, int] = {}
        for i in range(n):
            revs[f"VID-{i + 1:03d}"] = await sh.set_desired(
                f"VID-{i + 1:03d}", {"params": {"RTL_ALT": 2000 + 100 * i}, "rates": {"position": 4}}
            )
        reps: dict[str, Any] = {}
        for vid, rev in revs.items():
            reps[vid] = await sh.wait_converged(vid, rev)
        for i in range(n):
            assert fleet.vehicles[i].params["RTL_ALT"] == 2000 + 100 * i
            assert reps[f"VID-{i + 1:03d}"]["rates"] == {"position": 4.0}
