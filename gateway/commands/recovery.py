"""What to do with a command that was in flight when its gateway stopped.

The ledger's in-flight row says the command may have reached the vehicle:
the gateway died between the first transmission and the outcome. Sending it
again blindly could execute it twice (arm twice is harmless, `mission_start`
twice restarts the mission, `takeoff` twice may climb again). So each command
says, in its `spec.CommandDef.recovery`, how the vehicle shows whether it
took effect:

- `observe(cmd, ctx)` reads the vehicle now (the live model after a fresh
  HEARTBEAT, or a parameter, or the mission) and answers `DONE` (it took
  effect: `accepted`, "confirmed by vehicle state after restart"),
  `NOT_DONE` (it did not) or `UNKNOWN` (the state cannot tell);
- `resend`: whether sending it again is harmless when the state shows it
  did not take effect (then it runs as usual, preconditions included).

Anything else ends `unknown`, and the command is not re-sent. The rules are
listed per command in docs/commands.md.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum

from mavjet.contract.commands import Command
from mavjet.drivers.mavlink.autopilot import is_airborne
from mavjet.drivers.mavlink.mission import FENCE, MISSION, RALLY
from mavjet.drivers.mavlink.plan import digest
from mavjet.gateway.commands.actions import ActionContext
from mavjet.gateway.commands.preconditions import check_mode
from mavjet.gateway.stores.blobs import fetch_plan

CONFIRMED_DETAIL = "confirmed by vehicle state after restart"
GOTO_RADIUS_M = 5.0  # horizontal distance from the target that counts as "there"
GOTO_ALT_M = 3.0


class RecoveryVerdict(StrEnum):
    DONE = "done"
    NOT_DONE = "not_done"
    UNKNOWN = "unknown"


Observe = Callable[[Command, ActionContext], Awaitable[RecoveryVerdict]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Recovery:
    """How a command in flight at a gateway crash is settled (see the module docstring)."""

    observe: Observe
    resend: bool  # re-send when the vehicle shows the command did not take effect
    rule: str  # the rule in words (docs/commands.md, logs)


def _verdict(done: bool | None) -> RecoveryVerdict:
    return RecoveryVerdict.UNKNOWN if done is None else RecoveryVerdict.DONE if done else RecoveryVerdict.NOT_DONE


async def unobservable(cmd: Command, ctx: ActionContext) -> RecoveryVerdict:
    return RecoveryVerdict.UNKNOWN


async def no_effect(cmd: Command, ctx: ActionContext) -> RecoveryVerdict:
    return RecoveryVerdict.NOT_DONE  # a read: nothing on the vehicle to confirm, reading again is harmless


def armed_is(want: bool) -> Observe:
    async def observe(cmd: Command, ctx: ActionContext) -> RecoveryVerdict:
        armed = ctx.vehicle.telemetry.armed
        return _verdict(None if armed is None else armed == want)

    return observe


async def mode_is_requested(cmd: Command, ctx: ActionContext) -> RecoveryVerdict:
    mode = ctx.vehicle.telemetry.mode
    if mode is None:
        return RecoveryVerdict.UNKNOWN
    return _verdict(mode.upper() == check_mode(str(cmd.params["mode"]), ctx.vehicle.telemetry.modes))


def mode_contains(word: str) -> Observe:
    """The vehicle is in a mode named for the command (LAND, RTL, AUTO...; PX4's AUTO.RTL too)."""

    async def observe(cmd: Command, ctx: ActionContext) -> RecoveryVerdict:
        mode = ctx.vehicle.telemetry.mode
        return _verdict(None if mode is None else word in mode.upper())

    return observe


def mode_contains_or_unknown(word: str) -> Observe:
    """As `mode_contains`, but a vehicle in another mode is UNKNOWN (it may have left the mode since)."""
    inner = mode_contains(word)

    async def observe(cmd: Command, ctx: ActionContext) -> RecoveryVerdict:
        seen = await inner(cmd, ctx)
        return RecoveryVerdict.DONE if seen is RecoveryVerdict.DONE else RecoveryVerdict.UNKNOWN

    return observe


async def airborne(cmd: Command, ctx: ActionContext) -> RecoveryVerdict:
    # In the air: the takeoff took effect. On the ground it may still be spooling up: UNKNOWN, never NOT_DONE.
    return RecoveryVerdict.DONE if is_airborne(ctx.vehicle.telemetry.landed_state) else RecoveryVerdict.UNKNOWN


async def at_target(cmd: Command, ctx: ActionContext) -> RecoveryVerdict:
    snap = ctx.vehicle.telemetry.snapshot()
    lat, lon, alt = snap.get("lat_deg"), snap.get("lon_deg"), snap.get("alt_m")
    if lat is None or lon is None or alt is None:
        return RecoveryVerdict.UNKNOWN
    dn = math.radians(float(cmd.params["lat_deg"]) - float(lat)) * 6_371_000.0
    de = math.radians(float(cmd.params["lon_deg"]) - float(lon)) * 6_371_000.0 * math.cos(math.radians(float(lat)))
    there = math.hypot(dn, de) <= GOTO_RADIUS_M and abs(float(cmd.params["alt_m"]) - float(alt)) <= GOTO_ALT_M
    # Not there yet may mean "on its way": UNKNOWN, never NOT_DONE.
    return RecoveryVerdict.DONE if there else RecoveryVerdict.UNKNOWN


async def param_has_value(cmd: Command, ctx: ActionContext) -> RecoveryVerdict:
    pv = await ctx.vehicle.session.read_param(str(cmd.params["name"]))
    want = float(cmd.params["value"])
    # PARAM_VALUE carries a float32: compare at that precision.
    return _verdict(math.isclose(pv.value, want, rel_tol=1e-6, abs_tol=1e-6))


async def mission_matches_plan(cmd: Command, ctx: ActionContext) -> RecoveryVerdict:
    plan = await fetch_plan(ctx.nats.js, str(cmd.params["object"]))
    session = ctx.vehicle.session
    for mission_type, items in ((MISSION, plan.mission), (FENCE, plan.fence), (RALLY, plan.rally)):
        if mission_type != MISSION and not items:
            continue
        if digest(await session.download_mission(mission_type)) != digest(items):
            return RecoveryVerdict.NOT_DONE
    return RecoveryVerdict.DONE


async def mission_empty(cmd: Command, ctx: ActionContext) -> RecoveryVerdict:
    return _verdict(digest(await ctx.vehicle.session.download_mission(MISSION)) == digest([]))


UNOBSERVABLE = Recovery(observe=unobservable, resend=False,
                        rule="its effect cannot be read back: ends `unknown`, not re-sent")
