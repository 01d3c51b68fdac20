"""Params: converge, verified by read back, re-applied after a reboot; bad names and values reported."""

from __future__ import annotations

from tests.shadow.harness import Shadowed
from tests.support import wait_for

VID = "VID-001"


async def test_params_converge_and_are_reported(sh: Shadowed) -> None:
    v = sh.fleet.vehicles[0]
    rev = await sh.set_desired(VID, {"params": {"RTL_ALT": 2500, "WPNAV_SPEED": 750.5}})
    rep = await sh.wait_converged(VID, rev)
    assert v.params["RTL_ALT"] == 2500.0
    assert abs(v.params["WPNAV_SPEED"] - 750.5) < 1e-3
    assert rep["params"] == {"RTL_ALT": 2500, "WPNAV_SPEED": 750.5}
    assert rep["delta"] == {}
    assert rep["link"] == "up"
    # meta and config were written on connect, meta from AUTOPILOT_VERSION
    _, meta = await sh.get(VID, "meta")
    assert meta is not None and meta["flavour"] == "ardupilot" and meta["firmware"].count(".") == 2
    assert meta["serial"]
    _, config = await sh.get(VID, "config")
    assert config is not None and config["sysid"] == v.sysid


async def test_unknown_and_out_of_range_params_are_reported(sh: Shadowed) -> None:
    v = sh.fleet.vehicles[0]
    rev = await sh.set_desired(VID, {"params": {"NO_SUCH_PARAM": 1, "FENCE_ENABLE": 300, "RTL_ALT": 1800}})
    rep = await sh.wait_reported(
        VID, lambda r: r["desired_revision"] == rev and {"params.NO_SUCH_PARAM", "params.FENCE_ENABLE"} <= set(r["delta"])
    )
    assert "unknown parameter" in rep["delta"]["params.NO_SUCH_PARAM"]["reason"]
    assert "out of range" in rep["delta"]["params.FENCE_ENABLE"]["reason"]
    assert rep["converged"] is False
    # the good param next to them was still applied
    await wait_for(lambda: v.params["RTL_ALT"] == 1800.0)
    assert v.params["FENCE_ENABLE"] == 0.0


async def test_params_reapplied_after_link_outage(sh: Shadowed) -> None:
    v = sh.fleet.vehicles[0]
    rev = await sh.set_desired(VID, {"params": {"RTL_ALT": 2200}})
    await sh.wait_converged(VID, rev)
    twin = sh.gw.twins[VID]
    v.params["RTL_ALT"] = 1500.0  # changed behind the gateway's back while the link is out
    v.drop_link(3.0)
    await wait_for(lambda: not twin.link.is_up, 10)
    await wait_for(lambda: twin.link.is_up, 15)
    await wait_for(lambda: v.params["RTL_ALT"] == 2200.0, 15)
    await sh.wait_converged(VID, rev)


async def test_params_reapplied_after_reboot(sh: Shadowed) -> None:
    v = sh.fleet.vehicles[0]
    rev = await sh.set_desired(VID, {"params": {"RTL_ALT": 3000}, "rates": {"attitude": 2}})
    await sh.wait_converged(VID, rev)
    rec = sh.shadow.reconcilers[VID]
    passes_before = rec.passes
    # Someone changes it behind the gateway's back, then the vehicle reboots.
    v.params["RTL_ALT"] = 1500.0
    reboots = v.reboots
    v.reboot_pending = True
    await wait_for(lambda: v.reboots > reboots, 15)
    await wait_for(lambda: v.params["RTL_ALT"] == 3000.0, 30)
    assert rec.passes > passes_before
    rep = await sh.wait_converged(VID, rev)
    assert rep["rates"] == {"attitude": 2.0}
