"""What a command does to the vehicle, and how each way of ending becomes an `Outcome`.

An action is `async (cmd, ctx) -> Outcome`. `MavCommand` wraps a builder of
one MAV_CMD (COMMAND_LONG/INT); the parameter and mission commands run their
own protocols. `run_action` translates the protocol errors at one boundary:
a dropped link or a vehicle that was never heard after the send is `retry`
(the message is nak'd and redelivered), anything the vehicle answered is
final.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import anyio

from mavjet.contract.commands import CmdResult, Command, CommandInvalid, CommandName
from mavjet.contract.errors import LinkError
from mavjet.contract.events import EventType
from mavjet.contract.subjects import BLOBS_BUCKET
from mavjet.drivers.mavlink import autopilot
from mavjet.drivers.mavlink.command import CommandResult as MavCommandResult
from mavjet.drivers.mavlink.command import mav_result_name
from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.drivers.mavlink.logs import LogEntry, LogError
from mavjet.drivers.mavlink.mission import (
    FENCE,
    MISSION,
    RALLY,
    MissionItem,
    MissionRejected,
    MissionTimeout,
)
from mavjet.drivers.mavlink.modes import ModeTable, UnknownMode
from mavjet.drivers.mavlink.params import ParamError, ParamMismatch, ParamTimeout, ParamUnknown
from mavjet.drivers.mavlink.plan import PlanError, plan_to_dict
from mavjet.drivers.mavlink.plancheck import check_plan, describe, refusals, warnings
from mavjet.drivers.mavlink.terrain import terrain_points, terrain_refusals
from mavjet.drivers.mavlink.transfers import MissionMismatch
from mavjet.gateway.commands.logs import started_data
from mavjet.gateway.services import NatsAccess, TelemetryView, VehicleHandle
from mavjet.gateway.stores.blobs import fetch_plan, put_blob
from mavjet.gateway.stores.chunks import BlobError, BlobFailure
from mavjet.gateway.twin.telemetry import Event

_TEMPORARY = mavlink2.MAV_RESULT_TEMPORARILY_REJECTED
_REJECTED = (mavlink2.MAV_RESULT_DENIED, mavlink2.MAV_RESULT_UNSUPPORTED)
# ArduPilot sends a refused arm's reasons as STATUSTEXT right after the COMMAND_ACK
# ("Arm: Need Position Estimate"; a periodic "PreArm: ..." may come before it): after a
# refusal the command's window stays open this long for them.
REASON_GRACE_S = 0.2
_REASONS_MAX = 4  # texts kept in one detail (a boot refusal can list a handful)


@dataclass(slots=True, kw_only=True)
class Outcome:
    """How one execution attempt ended. `retry` means: not finished, nak and try again."""

    result: CmdResult
    mav_result: int | None = None
    detail: str = ""
    attempts: int = 0
    retry: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class ActionContext:
    """What an action may use: the vehicle (its MAVLink session), NATS (plans), when this attempt started.

    Protocol timeouts are the session's: the gateway's one protocol config.
    """

    vehicle: VehicleHandle
    nats: NatsAccess
    started_mono: float = field(default_factory=time.monotonic)


Action = Callable[[Command, ActionContext], Awaitable[Outcome]]


# ---------------------------------------------------------------------------
# MAV_CMDs


@dataclass(frozen=True, slots=True, kw_only=True)
class MavAction:
    """A MAV_CMD with its params (param1..param7), sent as COMMAND_LONG or COMMAND_INT."""

    command: int
    params: tuple[float, ...] = ()
    use_int: bool = False
    frame: int | None = None
    # param7 is a height above home, to be placed in the vehicle's flavour before sending (`place_altitude`).
    above_home: bool = False


def home_amsl_m(telemetry: TelemetryView) -> float | None:
    """The vehicle's home altitude above mean sea level, or None while not known: HOME_POSITION's, else what
    GLOBAL_POSITION_INT implies (alt AMSL - relative_alt, which both autopilots measure from home)."""
    home = (telemetry.channels.get("status") or {}).get("home")
    alt = home.get("alt_msl_m") if isinstance(home, dict) else None
    if isinstance(alt, int | float):
        return float(alt)
    pos = telemetry.channels.get("position") or {}
    amsl, rel = pos.get("alt_msl_m"), pos.get("alt_m")
    if isinstance(amsl, int | float) and isinstance(rel, int | float):
        return float(amsl) - float(rel)
    return None


def place_altitude(action: MavAction, telemetry: TelemetryView) -> MavAction | None:
    """`action` with its height above home turned into what the vehicle's flavour reads
    (`autopilot.command_altitude`), or None when that needs a home position not known yet."""
    if not action.above_home:
        return action
    placed = autopilot.command_altitude(telemetry.flavour, action.params[6], home_amsl_m(telemetry))
    if placed is None:
        return None
    z, frame = placed
    return replace(action, params=(*action.params[:6], z), frame=frame if action.use_int else action.frame,
                   above_home=False)


def set_mode_params(mode: str, modes: ModeTable | None) -> tuple[float, ...]:
    """MAV_CMD_DO_SET_MODE param1..3 for `mode` in the vehicle's flavour."""
    if modes is None:
        raise CommandInvalid(f"{CommandName.SET_MODE}: the vehicle's mode table is not known yet (no HEARTBEAT)", name=CommandName.SET_MODE)
    try:
        return autopilot.set_mode_params(modes, mode)
    except UnknownMode as exc:
        raise CommandInvalid(f"{CommandName.SET_MODE}: {exc}", name=CommandName.SET_MODE) from None


def reason_texts(events: list[Event], prefixes: tuple[str, ...]) -> list[str]:
    """The vehicle's reasons among the status texts of a command's window: distinct, in order, bounded.

    Repeats collapsed for the event stream still reach subscribers (internal
    events), so a PreArm line the stream only counts is a reason here too.
    """
    out: list[str] = []
    for ev in events:
        text = str(ev.data.get("text", ""))
        if ev.type == EventType.STATUSTEXT and text.startswith(prefixes) and text not in out:
            out.append(text)
    return out[:_REASONS_MAX]


@contextmanager
def status_texts(vehicle: VehicleHandle) -> Iterator[list[Event]]:
    """Collect the vehicle's status text events while the block runs."""
    seen: list[Event] = []
    unsubscribe = vehicle.subscribe(lambda ev: seen.append(ev) if ev.type == EventType.STATUSTEXT else None)
    try:
        yield seen
    finally:
        unsubscribe()


@dataclass(frozen=True, slots=True)
class MavCommand:
    """The action of a command that is one MAV_CMD: `build` maps the command (and mode table) to it.

    `reasons`: prefixes of the status texts that explain a refusal of this
    command (ArduPilot's "PreArm:" / "Arm:" for arming); they go into the
    detail of a result that is not accepted.
    """

    build: Callable[[Command, ModeTable | None], MavAction]
    reasons: tuple[str, ...] = ()
    # TEMPORARILY_REJECTED ends the command (`rejected`, with the vehicle's reasons) instead of a redelivery:
    # arming or taking off seconds later, when a preflight check happens to clear, is what an operator did
    # not ask for (PX4 answers every refused arm this way).
    temporary_is_final: bool = False

    async def __call__(self, cmd: Command, ctx: ActionContext) -> Outcome:
        placed = place_altitude(self.build(cmd, ctx.vehicle.telemetry.modes), ctx.vehicle.telemetry)
        if placed is None:
            return Outcome(result=CmdResult.REJECTED, detail=(
                f"{cmd.name} refused: the vehicle's home position is not known yet (this autopilot takes the "
                "altitude above mean sea level: home + alt_m)"))
        action = placed
        with status_texts(ctx.vehicle) as seen:
            outcome = await ctx.vehicle.session.command(
                action.command, action.params, use_int=action.use_int, frame=action.frame
            )
            refused = outcome.result not in (MavCommandResult.ACCEPTED, MavCommandResult.TIMEOUT)
            if self.reasons and refused:
                await anyio.sleep(REASON_GRACE_S)
        mr = outcome.mav_result
        if outcome.result is MavCommandResult.ACCEPTED:
            detail = "confirmed by HEARTBEAT (ACK lost)" if outcome.confirmed_by == "heartbeat" else ""
            return Outcome(result=CmdResult.ACCEPTED, mav_result=mr, detail=detail, attempts=outcome.attempts)
        if outcome.result is MavCommandResult.TIMEOUT:
            return no_answer(ctx, f"no COMMAND_ACK after {outcome.attempts} attempts", outcome.attempts)
        name = mav_result_name(mr)
        if mr == _TEMPORARY and not self.temporary_is_final:
            return Outcome(result=CmdResult.FAILED, mav_result=mr, detail="temporarily rejected by the vehicle",
                           attempts=outcome.attempts, retry=True)
        result = CmdResult.REJECTED if mr in _REJECTED or mr == _TEMPORARY else CmdResult.FAILED
        texts = reason_texts(seen, self.reasons) if self.reasons else []
        detail = f"{cmd.name} rejected: {'; '.join(texts)}" if texts else f"vehicle answered {name}"
        return Outcome(result=result, mav_result=mr, detail=detail, attempts=outcome.attempts)


def no_answer(ctx: ActionContext, detail: str, attempts: int) -> Outcome:
    """No answer: a link outage is retried later (nak); a vehicle that was heard and stayed silent is a timeout.

    "Heard" means a HEARTBEAT arrived after the command was first sent:
    without one the command most likely never reached the vehicle (the
    link state itself lags by the heartbeat timeout).
    """
    session = ctx.vehicle.session
    if not session.is_up or session.last_heartbeat_mono <= ctx.started_mono:
        return Outcome(result=CmdResult.TIMEOUT, detail=f"link down: {detail}", attempts=attempts, retry=True)
    return Outcome(result=CmdResult.TIMEOUT, detail=detail, attempts=attempts)


# ---------------------------------------------------------------------------
# parameter and mission protocols


async def param_get(cmd: Command, ctx: ActionContext) -> Outcome:
    pv = await ctx.vehicle.session.read_param(cmd.params["name"])
    return Outcome(result=CmdResult.ACCEPTED, detail=f"{pv.name} = {pv.value:g}", attempts=1,
                   extra={"value": pv.value})


async def param_set(cmd: Command, ctx: ActionContext) -> Outcome:
    pv = await ctx.vehicle.session.set_param(cmd.params["name"], cmd.params["value"])
    return Outcome(result=CmdResult.ACCEPTED, detail=f"{pv.name} = {pv.value:g}", attempts=1,
                   extra={"value": pv.value})


async def mission_clear(cmd: Command, ctx: ActionContext) -> Outcome:
    await ctx.vehicle.session.clear_mission()
    return Outcome(result=CmdResult.ACCEPTED, detail="mission cleared", attempts=1)


async def mission_download(cmd: Command, ctx: ActionContext) -> Outcome:
    """What the vehicle holds (mission, fence, rally), as a `.plan` in TWIN_BLOBS: `readback/<vid>/<UTC>.plan`."""
    session, vid = ctx.vehicle.session, ctx.vehicle.vid
    mission = await session.download_mission(MISSION)
    lists: dict[int, list[MissionItem]] = {}
    for kind in (FENCE, RALLY):
        try:
            lists[kind] = await session.download_mission(kind)
        except (MissionRejected, MissionTimeout):  # an autopilot without fences or rally points
            lists[kind] = []
    doc = json.dumps(plan_to_dict(mission, lists[FENCE], lists[RALLY]), indent=2).encode()
    js = ctx.nats.js
    if js is None:
        return Outcome(result=CmdResult.TIMEOUT, detail="NATS not connected: cannot store the plan", retry=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    name = f"readback/{vid}/{stamp}.plan"
    await put_blob(js, doc, alias=name)
    count = len(mission)  # home (seq 0) included, as mission_upload counts
    return Outcome(result=CmdResult.ACCEPTED, detail=f"{count} items, {len(lists[FENCE])} fence, "
                   f"{len(lists[RALLY])} rally -> {name}", attempts=1,
                   extra={"object": name, "count": count, "fence_count": len(lists[FENCE]),
                          "rally_count": len(lists[RALLY])})


async def mission_upload(cmd: Command, ctx: ActionContext) -> Outcome:
    obj_name = str(cmd.params["object"])
    try:
        plan = await fetch_plan(ctx.nats.js, obj_name)
    except BlobError as exc:
        if exc.kind is BlobFailure.NOT_CONNECTED:
            return Outcome(result=CmdResult.TIMEOUT, detail="NATS not connected: cannot read the plan", retry=True)
        if exc.kind is BlobFailure.NOT_FOUND:
            return Outcome(result=CmdResult.INVALID, detail=f"mission_upload: no object {obj_name!r} in {BLOBS_BUCKET}")
        return Outcome(result=CmdResult.TIMEOUT, detail=f"reading {obj_name!r}: {exc.error}: {exc.detail}", retry=True)
    except PlanError as exc:
        return Outcome(result=CmdResult.INVALID, detail=f"mission_upload: {obj_name}: {exc}")
    # The plan checks `mavjet mission put` made (docs/missions.md): a refusal sends nothing, warnings go on.
    findings = check_plan(plan, vehicle_class=ctx.vehicle.telemetry.vehicle_class)
    if refusing := refusals(findings):
        return Outcome(result=CmdResult.INVALID, detail=f"mission_upload: {obj_name} refused: {describe(refusing)}",
                       extra={"findings": [f.as_dict() for f in findings]})
    warned = [str(f) for f in warnings(findings)]
    session = ctx.vehicle.session
    points = terrain_points(plan.mission)
    if points:  # the vehicle alone can say whether it holds terrain data there
        refused = terrain_refusals(plan.mission, await session.terrain_reports(points))
        if refused:
            return Outcome(result=CmdResult.REJECTED, detail=f"mission_upload: {obj_name}: {'; '.join(refused)}",
                           attempts=1)
    digest = await session.upload_and_verify(plan.mission)
    count = len(plan.mission)
    uploaded: dict[str, Any] = {"digest": digest, "count": count}
    parts = [f"{count} items"]
    for kind, mission_type, items in (("fence", FENCE, plan.fence), ("rally", RALLY, plan.rally)):
        # Only what the plan holds: a plan without a geofence leaves the vehicle's fence alone.
        kind_digest = None
        if items:
            kind_digest = await session.upload_and_verify(items, mission_type)
            parts.append(f"{len(items)} {kind} item{'' if len(items) == 1 else 's'}")
        uploaded[f"{kind}_digest"] = kind_digest
        uploaded[f"{kind}_count"] = len(items)
    # A verified fence from the plan protects only once switched on (unless the command says not to).
    enable = bool(plan.fence) and cmd.params.get("enable_fence", True) is not False
    uploaded["fence_enabled"] = await fence_switch(ctx, enable=enable)
    ctx.vehicle.emit(EventType.MISSION_UPLOADED, object=obj_name, **uploaded)
    detail = f"{', '.join(parts)}, read back and verified" + "".join(f"; warning: {w}" for w in warned)
    return Outcome(result=CmdResult.ACCEPTED, detail=detail, attempts=1, extra={**uploaded, "warnings": warned})


def pick_log(entries: Sequence[LogEntry], wanted: str) -> LogEntry | None:
    """The log `wanted` names: an id, or `latest`: the newest by its UTC start where the autopilot knew the
    time (PX4's ids follow its directory order, not time), else the highest id (ArduPilot numbers in order)."""
    if wanted == "latest":
        return max(entries, key=lambda e: (e.time_utc_s, e.log_id), default=None)
    return next((e for e in entries if e.log_id == int(wanted)), None)


async def log_download(cmd: Command, ctx: ActionContext) -> Outcome:
    """Find the log and start its download (mavjet.gateway.commands.logs runs it): accepted means started."""
    wanted = str(cmd.params.get("log") or "latest")
    entries = await ctx.vehicle.session.list_logs()
    if not entries:
        return Outcome(result=CmdResult.REJECTED, detail="log_download: the vehicle holds no logs", attempts=1)
    found = pick_log(entries, wanted)
    if found is None:
        ids = ", ".join(str(e.log_id) for e in entries)
        return Outcome(result=CmdResult.REJECTED, detail=f"log_download: no log {wanted} (the vehicle has {ids})",
                       attempts=1)
    data = started_data(ctx.vehicle.vid, found)
    ctx.vehicle.emit(EventType.LOG_DOWNLOAD_STARTED, **data)
    return Outcome(result=CmdResult.ACCEPTED, attempts=1, extra=data,
                   detail=f"log {found.log_id} ({found.size_bytes} bytes) downloading into {data['object']}")


FENCE_ENABLE = "FENCE_ENABLE"


async def fence_switch(ctx: ActionContext, *, enable: bool) -> bool:
    """Whether the vehicle's fence is enabled after an upload; switched on first when `enable`.

    Zones are uploaded and verified before the switch, so the vehicle never
    enforces a half-written fence. The value is the vehicle's, read back
    (PARAM_VALUE), never assumed. PX4 has no such switch (its geofence is
    active whenever it holds zones and GF_ACTION is set): it reports whether
    it holds zones.
    """
    session = ctx.vehicle.session
    if ctx.vehicle.telemetry.flavour == "px4":
        return enable
    if enable:
        pv = await session.set_param(FENCE_ENABLE, 1.0)
    else:
        pv = await session.read_param(FENCE_ENABLE)
    return pv.value >= 0.5


# ---------------------------------------------------------------------------
# the one boundary where protocol errors become outcomes


async def run_action(action: Action, cmd: Command, ctx: ActionContext) -> Outcome:
    try:
        return await action(cmd, ctx)
    except LinkError as exc:
        return Outcome(result=CmdResult.TIMEOUT, detail=f"link dropped: {exc.reason}", retry=True)
    except ParamMismatch as exc:
        return Outcome(result=CmdResult.REJECTED, detail=str(exc), attempts=exc.attempts)
    except ParamUnknown as exc:  # the vehicle said so (PX4's PARAM_ERROR), or its parameter list lacks the name
        return Outcome(result=CmdResult.REJECTED, detail=str(exc), attempts=1)
    except ParamTimeout as exc:
        return no_answer(ctx, str(exc), exc.attempts)
    except ParamError as exc:
        return Outcome(result=CmdResult.FAILED, detail=str(exc))
    except MissionRejected as exc:
        return Outcome(result=CmdResult.REJECTED, detail=str(exc), attempts=1)
    except MissionTimeout as exc:
        return no_answer(ctx, str(exc), exc.retries + 1)
    except MissionMismatch as exc:
        return Outcome(result=CmdResult.FAILED, detail=str(exc), attempts=1)
    except LogError as exc:
        return no_answer(ctx, str(exc), getattr(exc, "attempts", 1))
    except CommandInvalid as exc:
        return Outcome(result=CmdResult.INVALID, detail=exc.reason)
