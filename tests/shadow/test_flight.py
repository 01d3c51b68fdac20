"""Flight state: once per desired revision, pilots and failsafes are reported, never overridden."""

from __future__ import annotations

from typing import Any

import msgpack
from nats.aio.client import Client

from mavjet.contract.subjects import EVENTS_STREAM, event_subject
from mavjet.drivers.mavlink.dialect import mavlink2
from tests.shadow.harness import Shadowed
from tests.support import ENV, wait_for, wait_for_async

VID = "VID-001"
SET_MODE = mavlink2.MAV_CMD_DO_SET_MODE
ARM = mavlink2.MAV_CMD_COMPONENT_ARM_DISARM


def executed(sh: Shadowed, command: int) -> int:
    return sum(1 for e in sh.fleet.vehicles[0].executions if e.command == command)


async def last_event(nc: Client, etype: str) -> dict[str, Any] | None:
    try:
        msg = await nc.jetstream().get_last_msg(EVENTS_STREAM, event_subject(ENV, VID, etype))
    except Exception:
        return None
    data: dict[str, Any] = msgpack.unpackb(msg.data or b"", timestamp=3)["data"]
    return data


async def test_mode_applied_once_per_revision_pilot_not_overridden(sh: Shadowed) -> None:
    v = sh.fleet.vehicles[0]
    await wait_for(lambda: v.position_ok and v.ekf_ok, 10)
    rev = await sh.set_desired(VID, {"mode": "GUIDED"})
    rep = await sh.wait_converged(VID, rev)
    assert v.mode == "GUIDED" and rep["mode"] == "GUIDED"
    assert rep["applied"]["mode"]["revision"] == rev
    assert executed(sh, SET_MODE) == 1, [(e.command, e.result, e.time, e.source) for e in v.executions if e.command == SET_MODE]
    # A pilot switches to LOITER: reported, not overridden.
    v.set_mode("LOITER", reason="rc")
    rep = await sh.wait_reported(VID, lambda r: r["mode"] == "LOITER" and "mode" in r["delta"])
    assert "not overridden" in rep["delta"]["mode"]["reason"]
    rec = sh.shadow.reconcilers[VID]
    passes = rec.passes
    await wait_for(lambda: rec.passes >= passes + 5, 10)
    assert v.mode == "LOITER" and executed(sh, SET_MODE) == 1
    # A new revision is a new request: applied once more.
    rev2 = await sh.set_desired(VID, {"mode": "GUIDED"})
    await sh.wait_converged(VID, rev2)
    assert v.mode == "GUIDED" and executed(sh, SET_MODE) == 2


async def test_arm_applied_and_persistent_rejection_fails_with_backoff(sh: Shadowed) -> None:
    v = sh.fleet.vehicles[0]
    await wait_for(lambda: v.position_ok and v.ekf_ok, 10)
    # Pre-arm checks will refuse: minimum arming voltage above the pack's.
    rev = await sh.set_desired(VID, {"mode": "GUIDED", "armed": True, "params": {"BATT_ARM_VOLT": 30}})
    rep = await sh.wait_reported(
        VID, lambda r: r["desired_revision"] == rev and r["applied"].get("armed", {}).get("attempts") == 3, 30
    )
    assert rep["converged"] is False
    assert "PreArm" in rep["delta"]["armed"]["reason"] and rep["delta"]["armed"]["attempts"] >= 1
    assert executed(sh, ARM) == 3
    ev = await wait_for_event(sh, "shadow_failed", "armed")
    assert ev["desired_revision"] == rev
    # Capped: no further blind retries for this revision.
    rec = sh.shadow.reconcilers[VID]
    passes = rec.passes
    await wait_for(lambda: rec.passes >= passes + 8, 15)
    assert executed(sh, ARM) == 3 and not v.armed
    # Fix the cause in a new revision: it arms.
    rev2 = await sh.set_desired(VID, {"mode": "GUIDED", "armed": True, "params": {"BATT_ARM_VOLT": 0}})
    rep = await sh.wait_converged(VID, rev2)
    assert v.armed and rep["armed"] is True
    conv = await wait_for_event(sh, "shadow_converged", None)
    assert conv["desired_revision"] == rev2 and conv["duration_s"] >= 0


async def wait_for_event(sh: Shadowed, etype: str, fld: str | None) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        ev = await last_event(sh.nc, etype)
        if ev is not None and (fld is None or ev.get("field") == fld):
            return ev
        return None

    result: dict[str, Any] = await wait_for_async(check, 20)
    return result


async def test_failsafe_is_not_overridden(sh: Shadowed) -> None:
    v = sh.fleet.vehicles[0]
    await wait_for(lambda: v.position_ok and v.ekf_ok, 10)
    rev = await sh.set_desired(VID, {"mode": "GUIDED", "armed": True})
    await sh.wait_converged(VID, rev)
    assert v.takeoff(15.0) == mavlink2.MAV_RESULT_ACCEPTED
    await wait_for(lambda: v.alt_m > 3.0, 15)
    twin = sh.gw.twins[VID]
    v.set_battery_pct(20.0)  # below BATT_LOW_VOLT: the autopilot switches to RTL
    await wait_for(lambda: v.mode == "RTL", 15)
    await wait_for(lambda: twin.model.failsafe_active and twin.model.mode == "RTL", 15)
    modes_before = executed(sh, SET_MODE)
    rep = await sh.wait_reported(VID, lambda r: r["mode"] == "RTL" and "mode" in r["delta"])
    assert rep["converged"] is False
    # An operator asks for GUIDED during the failsafe: held, not sent.
    rev2 = await sh.set_desired(VID, {"mode": "GUIDED", "armed": True})
    rep = await sh.wait_reported(VID, lambda r: r["desired_revision"] == rev2 and "mode" in r["delta"])
    assert "failsafe" in rep["delta"]["mode"]["reason"]
    rec = sh.shadow.reconcilers[VID]
    passes = rec.passes
    await wait_for(lambda: rec.passes >= passes + 5, 10)
    assert executed(sh, SET_MODE) == modes_before
    assert v.mode in ("RTL", "LAND")
