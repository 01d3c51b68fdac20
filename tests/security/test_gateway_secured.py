"""End to end under the generated auth: a real gateway process with VID-001's credential.

It serves its sim vehicle (state published, a command executed, the shadow
reconciled and `reported` written) and trips no permission anywhere.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mavjet.contract.subjects import (
    CMD_STREAM,
    EVENTS_STREAM,
    SHADOW_BUCKET,
    cmd_filter,
    shadow_key,
)
from mavjet.ops.client import CommandClient
from mavjet.sim.fleet import SimConfig, SimFleet
from tests.security.conftest import ENV, Secured
from tests.support.gwprocess import gateway_process, state_published
from tests.support.wait import WaitTimeout, wait_for_async

pytestmark = pytest.mark.timeout(120)


async def test_gateway_serves_its_vehicle_with_a_vehicle_credential(hub: Secured, tmp_path: Path) -> None:
    log = tmp_path / "gateway.log"
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=5.0)) as fleet, gateway_process(
            vid="VID-001", endpoint=fleet.endpoints[0], url=hub.server.url, env=ENV, creds=hub.creds("VID-001"),
            state_dir=tmp_path / "state", instance="secured-gw", log=log):
        op, admin = await hub.connect("operator"), await hub.connect("admin")
        try:
            ajs = admin.jetstream()
            await state_published(ajs, ENV, "VID-001")

            async with CommandClient(op, ENV, issuer="pytest") as client:
                result = await client.call("VID-001", "set_mode", {"mode": "GUIDED"}, timeout_s=30)
            assert result.result == "accepted", result

            kv = await op.jetstream().key_value(SHADOW_BUCKET)
            rev = await kv.put(shadow_key(ENV, "VID-001", "desired"), json.dumps({"mode": "LOITER"}).encode())

            async def reported() -> dict[str, object] | None:
                try:
                    doc = json.loads((await kv.get(shadow_key(ENV, "VID-001", "reported"))).value or b"{}")
                except Exception:
                    return None
                return doc if doc.get("desired_revision") == rev and doc.get("converged") else None

            try:
                assert await wait_for_async(reported, timeout_s=40)
            except WaitTimeout:  # once in a CI run (not reproduced since): keep what explains it
                try:
                    last: object = (await kv.get(shadow_key(ENV, "VID-001", "reported"))).value
                except Exception as exc:  # no reported document at all is itself the finding
                    last = exc
                pytest.fail(f"shadow not converged on revision {rev}; reported={last!r}\n"
                            f"gateway log tail:\n{log.read_text()[-4000:]}")
            assert (await kv.get(shadow_key(ENV, "VID-001", "meta"))).value
            events = await ajs.stream_info(EVENTS_STREAM, subjects_filter="fleet.test.veh.VID-001.evt.cmd_result")
            assert events.state.subjects
        finally:
            await op.close()
            await admin.close()
    text = log.read_text()
    assert "permissions violation" not in text.lower(), text[-3000:]
    assert "Violation" not in hub.log(), [ln for ln in hub.log().splitlines() if "Violation" in ln]


async def test_hub_gateway_pulls_its_vehicles_commands_through_one_consumer(hub: Secured, tmp_path: Path) -> None:
    """The hub credential (VID-003, VID-004): one gateway consumer with both filters, and no permission tripped."""
    log = tmp_path / "gateway.log"
    async with SimFleet(SimConfig(vehicles=2, base_port=0, speedup=5.0)) as fleet, gateway_process(
            vid="VID-003", endpoint=fleet.endpoints[0], more={"VID-004": fleet.endpoints[1]}, url=hub.server.url,
            env=ENV, creds=hub.creds("hub"), state_dir=tmp_path / "state", instance="secured-hub", log=log):
        op, admin = await hub.connect("operator"), await hub.connect("admin")
        try:
            ajs = admin.jetstream()
            for vid in ("VID-003", "VID-004"):
                await state_published(ajs, ENV, vid)
            async with CommandClient(op, ENV, issuer="pytest") as client:
                for vid in ("VID-003", "VID-004"):
                    result = await client.call(vid, "set_mode", {"mode": "GUIDED"}, timeout_s=30)
                    assert result.result == "accepted", result
            consumers = await ajs.consumers_info(CMD_STREAM)
            assert len(consumers) == 1 and consumers[0].name.startswith("gwx_secured-hub"), consumers
            assert sorted(consumers[0].config.filter_subjects or []) == [cmd_filter(ENV, "VID-003"),
                                                                         cmd_filter(ENV, "VID-004")]
        finally:
            await op.close()
            await admin.close()
    text = log.read_text()
    assert "permissions violation" not in text.lower(), text[-3000:]
    assert "Violation" not in hub.log(), [ln for ln in hub.log().splitlines() if "Violation" in ln]
