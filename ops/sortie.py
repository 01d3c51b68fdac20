"""The demo's sortie flown through TWIN_CMD, like an operator's script would.

`fly_sortie(nc, env, vid)`: the flavour's start mode, arm, take off, fly a
square of waypoints around the start point, RTL, and wait until the vehicle
has landed and disarmed — each step a command on `fleet.<env>.veh.<vid>.cmd.<name>`
whose `cmd_result` is awaited, progress read from the twin's state channels
(`state.position`, `state.status`). Nothing here talks to the vehicle or the
gateway directly: if the sortie flies, the whole command path works.

Each autopilot is flown its own way (`START_MODE`): ArduCopter in GUIDED
(NAV_TAKEOFF, then DO_REPOSITION); PX4 as QGroundControl flies it, from
AUTO.LOITER (Hold): NAV_TAKEOFF makes PX4 switch to AUTO.TAKEOFF and back to
AUTO.LOITER at the altitude, DO_REPOSITION with the change-mode flag flies in
AUTO.LOITER, and NAV_RETURN_TO_LAUNCH is AUTO.RTL, which lands and disarms.
PX4 has no GUIDED mode.

`fly_sortie_forever` repeats it with a pause (the demo's vehicles fly until
the demo stops); a failed step is retried after a delay.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg

from mavjet.contract import envelope
from mavjet.contract.commands import CommandName
from mavjet.contract.errors import MavjetError
from mavjet.contract.modes import Flavour
from mavjet.contract.subjects import state_filter
from mavjet.contract.vehicle import is_past_boot
from mavjet.ops.client import CommandClient, Result

log = structlog.get_logger("mavjet.sortie")

EARTH_M_PER_DEG = 111_320.0
# The mode each flavour is put in before arming (the twin's `status.flavour`).
START_MODE: dict[str, str] = {Flavour.ARDUPILOT: "GUIDED", Flavour.PX4: "AUTO.LOITER"}


def start_mode(flavour: str | None) -> str:
    return START_MODE.get(flavour or "", "GUIDED")


class SortieFailed(MavjetError):
    """A step of the sortie did not happen; `step` names it, `result` is its cmd_result if any."""

    def __init__(self, step: str, reason: str, result: Result | None = None) -> None:
        super().__init__(f"sortie step {step}: {reason}")
        self.step = step
        self.reason = reason
        self.result = result


@dataclass(frozen=True, slots=True, kw_only=True)
class SortiePlan:
    alt_m: float = 20.0
    radius_m: float = 40.0
    legs: int = 4
    turn_deg: float = 0.0
    arrive_m: float = 2.5  # a waypoint counts as reached within this distance
    step_timeout_s: float = 120.0  # per flight phase (climb, each leg, return)
    command_timeout_s: float = 30.0
    deadline_s: float = 30.0


@dataclass(slots=True)
class _Twin:
    """The latest state channels of one vehicle, from a core subscription."""

    channels: dict[str, dict[str, Any]] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def on_msg(self, msg: Msg) -> None:
        try:
            env = envelope.unpack(msg.data)
        except envelope.EnvelopeError:
            return
        self.channels[msg.subject.rsplit(".", 1)[-1]] = env.data
        self.changed.set()

    def get(self, channel: str, key: str) -> Any:
        return self.channels.get(channel, {}).get(key)

    async def until(self, what: str, pred: Any, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not pred():
            left = deadline - time.monotonic()
            if left <= 0:
                raise SortieFailed(what, f"not reached within {timeout_s:g} s")
            self.changed.clear()
            with anyio.move_on_after(min(left, 1.0)):
                await self.changed.wait()


def offset_deg(lat_deg: float, lon_deg: float, north_m: float, east_m: float) -> tuple[float, float]:
    """A point `north_m`/`east_m` from (lat, lon), flat-earth (fine for a few hundred metres)."""
    dlat = north_m / EARTH_M_PER_DEG
    dlon = east_m / (EARTH_M_PER_DEG * max(math.cos(math.radians(lat_deg)), 1e-6))
    return lat_deg + dlat, lon_deg + dlon


def distance_m(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    n = (lat2 - lat1) * EARTH_M_PER_DEG
    e = (lon2 - lon1) * EARTH_M_PER_DEG * math.cos(math.radians((lat1 + lat2) / 2))
    return math.hypot(n, e)


def waypoints(lat_deg: float, lon_deg: float, plan: SortiePlan) -> list[tuple[float, float]]:
    out = []
    for k in range(plan.legs):
        ang = math.radians(plan.turn_deg + 360.0 * k / plan.legs)
        out.append(offset_deg(lat_deg, lon_deg, plan.radius_m * math.cos(ang), plan.radius_m * math.sin(ang)))
    return out


async def fly_sortie(
    nc: Client, env: str, vid: str, plan: SortiePlan | None = None, *, client: CommandClient | None = None
) -> list[Result]:
    """Fly one sortie through TWIN_CMD; returns every command's result, raises SortieFailed."""
    plan = plan or SortiePlan()
    twin = _Twin()
    sub = await nc.subscribe(state_filter(env, vid), cb=twin.on_msg)
    own = client is None
    cc = client or CommandClient(nc, env, issuer=f"sortie/{vid}")
    results: list[Result] = []

    async def command(name: CommandName, params: dict[str, Any] | None = None) -> None:
        r = await cc.call(vid, name, params, deadline_s=plan.deadline_s, timeout_s=plan.command_timeout_s)
        results.append(r)
        if not r.accepted:
            raise SortieFailed(name, f"{r.result}: {r.detail}", r)

    try:
        await cc.start()
        await twin.until("position", lambda: twin.get("position", "lat_deg") is not None
                         and twin.get("status", "armed") is not None, plan.step_timeout_s)
        # Out of BOOT first: ArduPilot reverts a mode set while booting and refuses to arm ("Arm: System not
        # initialised"). The arm itself is tried once: a refusal ends the sortie with the vehicle's reason
        # (never retried blindly; `fly_sortie_forever` starts a new sortie after its pause).
        await twin.until("standby", lambda: is_past_boot(twin.get("status", "system_status")), plan.step_timeout_s)
        lat0, lon0 = twin.get("position", "lat_deg"), twin.get("position", "lon_deg")
        log.info("sortie_start", vehicle=vid, alt_m=plan.alt_m, radius_m=plan.radius_m)
        await command(CommandName.SET_MODE, {"mode": start_mode(twin.get("status", "flavour"))})
        await command(CommandName.ARM)
        await command(CommandName.TAKEOFF, {"alt_m": plan.alt_m})
        await twin.until("climb", lambda: (twin.get("position", "alt_m") or 0.0) >= plan.alt_m - 1.0,
                         plan.step_timeout_s)
        for i, (lat, lon) in enumerate(waypoints(lat0, lon0, plan)):
            await command(CommandName.GOTO, {"lat_deg": lat, "lon_deg": lon, "alt_m": plan.alt_m})

            def there(lat: float = lat, lon: float = lon) -> bool:
                return distance_m(twin.get("position", "lat_deg"), twin.get("position", "lon_deg"),
                                  lat, lon) <= plan.arrive_m

            await twin.until(f"leg {i + 1}", there, plan.step_timeout_s)
        await command(CommandName.RTL)
        await twin.until("return and land", lambda: twin.get("status", "armed") is False, plan.step_timeout_s)
        log.info("sortie_done", vehicle=vid, commands=len(results))
        return results
    finally:
        await sub.unsubscribe()
        if own:
            await cc.close()


async def fly_sortie_forever(
    nc: Client, env: str, vid: str, *, index: int = 0, pause_s: float = 10.0, retry_s: float = 5.0
) -> None:
    """The demo's vehicles: fly sorties until cancelled, with a pause and some variety between vehicles."""
    rng = random.Random(index)
    await asyncio.sleep(2.0 + 3.0 * (index % 10) + rng.uniform(0.0, 2.0))
    async with CommandClient(nc, env, issuer=f"demo-sortie/{vid}") as cc:
        while True:
            plan = SortiePlan(alt_m=15.0 + 5.0 * (index % 4), radius_m=40.0 + 15.0 * (index % 5),
                              turn_deg=(index * 37.0) % 360.0)
            try:
                await fly_sortie(nc, env, vid, plan, client=cc)
                await asyncio.sleep(pause_s + rng.uniform(0.0, pause_s / 2))
            except MavjetError as exc:
                log.warning("sortie_failed", vehicle=vid, error=str(exc), retry_in_s=retry_s)
                if isinstance(exc, SortieFailed) and exc.step not in ("position", CommandName.SET_MODE, CommandName.ARM):
                    try:  # whatever went wrong in the air, bring it home before trying again
                        await cc.call(vid, CommandName.RTL, timeout_s=30.0)
                    except MavjetError:
                        pass
                await asyncio.sleep(retry_s)
