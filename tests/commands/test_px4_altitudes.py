"""Takeoff and goto altitudes per autopilot flavour (drivers.mavlink.autopilot.command_altitude, placed at send by
gateway.commands.actions.place_altitude): ArduPilot gets the height above home in a relative frame; PX4 reads
param7 / z above mean sea level whatever the frame (captures tests/fixtures/px4), so it gets home AMSL + alt_m,
and nothing is sent while its home is not known."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import anyio

from mavjet.contract.commands import CmdResult, Command, validate_params
from mavjet.drivers.mavlink.dialect import mavlink2 as M
from mavjet.drivers.mavlink.modes import Flavour, ModeTable, VehicleClass
from mavjet.gateway.commands.actions import ActionContext, MavCommand, home_amsl_m, place_altitude
from mavjet.gateway.commands.spec import COMMANDS, mav_action
from tests.fixtures.px4.replay import load, of_type

PX4 = ModeTable(flavour=Flavour.PX4, vehicle_class=VehicleClass.COPTER)
COPTER = ModeTable(flavour=Flavour.ARDUPILOT, vehicle_class=VehicleClass.COPTER)


def cmd(name: str, **params: object) -> Command:
    return Command(cmd_id="c", name=name, issued_ns=0, deadline_ns=None, params=validate_params(name, params))


@dataclass
class Telemetry:
    flavour: str
    home_alt: float | None
    modes: ModeTable | None = None
    channels: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        home = None if self.home_alt is None else {"lat_deg": 47.3, "lon_deg": 8.5, "alt_msl_m": self.home_alt}
        self.channels["status"] = {"home": home}


def test_ardupilot_takeoff_and_goto_stay_relative_to_home() -> None:
    t = Telemetry("ardupilot", 584.0)
    takeoff = place_altitude(mav_action(cmd("takeoff", alt_m=25), COPTER), t)  # type: ignore[arg-type]
    assert takeoff is not None and takeoff.params[6] == 25.0 and not takeoff.use_int
    goto = place_altitude(mav_action(cmd("goto", lat_deg=-35.0, lon_deg=149.0, alt_m=30), COPTER), t)  # type: ignore[arg-type]
    assert goto is not None and (goto.params[6], goto.frame) == (30.0, M.MAV_FRAME_GLOBAL_RELATIVE_ALT_INT)


def test_px4_takeoff_and_goto_are_home_amsl_plus_alt_as_px4_climbed_to() -> None:
    frames = load("takeoff_and_reposition")
    home = of_type(frames, "HOME_POSITION", to_vehicle=False)[0].msg.altitude / 1000
    climbed = [f.msg for f in of_type(frames, "COMMAND_LONG", to_vehicle=True) if f.msg.command == 22][-1]
    (repo,) = [f.msg for f in of_type(frames, "COMMAND_INT", to_vehicle=True)]
    t = Telemetry("px4", home)
    takeoff = place_altitude(mav_action(cmd("takeoff", alt_m=10), PX4), t)  # type: ignore[arg-type]
    assert takeoff is not None and math.isclose(takeoff.params[6], climbed.param7, abs_tol=1e-4)
    goto = place_altitude(mav_action(cmd("goto", lat_deg=47.4, lon_deg=8.5, alt_m=15), PX4), t)  # type: ignore[arg-type]
    assert goto is not None and goto.use_int and goto.frame == repo.frame == M.MAV_FRAME_GLOBAL_INT
    assert math.isclose(goto.params[6], repo.z, abs_tol=1e-4)
    # land, rtl, set_mode carry no altitude to place
    for name, params in (("land", {}), ("rtl", {})):
        a = mav_action(cmd(name, **params), PX4)
        assert place_altitude(a, t) == a  # type: ignore[arg-type]


def test_home_amsl_is_read_from_the_status_channel() -> None:
    assert home_amsl_m(Telemetry("px4", 489.4)) == 489.4  # type: ignore[arg-type]
    assert home_amsl_m(Telemetry("px4", None)) is None  # type: ignore[arg-type]


class _NoSession:
    async def command(self, *a: object, **k: object) -> object:
        raise AssertionError("nothing may be sent without a home")


@dataclass
class _Vehicle:
    telemetry: Telemetry
    session: _NoSession = field(default_factory=_NoSession)
    vid: str = "VID-001"

    def subscribe(self, handler: object) -> object:
        return lambda: None


def test_px4_takeoff_without_a_home_is_rejected_and_nothing_is_sent() -> None:
    action = COMMANDS["takeoff"].action
    assert isinstance(action, MavCommand)
    ctx = ActionContext(vehicle=_Vehicle(Telemetry("px4", None, modes=PX4)), nats=None)  # type: ignore[arg-type]

    async def run() -> None:
        out = await action(cmd("takeoff", alt_m=10), ctx)
        assert out.result == CmdResult.REJECTED and "home position is not known" in out.detail, out

    anyio.run(run)


def test_without_home_position_home_is_what_global_position_implies() -> None:
    t = Telemetry("px4", None)
    t.channels["position"] = {"alt_msl_m": 499.4, "alt_m": 10.0}
    assert home_amsl_m(t) == 499.4 - 10.0  # type: ignore[arg-type]
