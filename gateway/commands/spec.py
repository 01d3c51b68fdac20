"""Every command, defined once: its wire spec, its preconditions, its action.

`COMMANDS` has exactly one `CommandDef` per name of the contract's
`CATALOGUE` (a test holds it to that). Adding a command means adding its
wire spec in `mavjet.contract.commands` and one row here; the executor has
no per-command branches.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from mavjet.contract.commands import (
    CATALOGUE,
    Command,
    CommandInvalid,
    CommandName,
    CommandSpec,
    decode_command,
)
from mavjet.drivers.mavlink import autopilot
from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.drivers.mavlink.modes import ModeTable
from mavjet.gateway.commands.actions import (
    Action,
    MavAction,
    MavCommand,
    log_download,
    mission_clear,
    mission_download,
    mission_upload,
    param_get,
    param_set,
    set_mode_params,
)
from mavjet.gateway.commands.loglist import log_list, log_list_failure
from mavjet.gateway.commands.preconditions import (
    check_mode,
    failsafe_refusal,
    goto_failure,
    log_download_failure,
    no_precondition,
    reboot_failure,
    takeoff_failure,
    to_recovery_mode,
)
from mavjet.gateway.commands.recovery import (
    UNOBSERVABLE,
    Recovery,
    airborne,
    armed_is,
    at_target,
    mission_empty,
    mission_matches_plan,
    mode_contains,
    mode_contains_or_unknown,
    mode_is_requested,
    no_effect,
    param_has_value,
)
from mavjet.gateway.services import LiveState

Precondition = Callable[[Command, LiveState], "str | None"]
VehicleCheck = Callable[[Command, "ModeTable | None"], None]


def _never(cmd: Command, state: LiveState) -> bool:
    return False


def _no_check(cmd: Command, modes: ModeTable | None) -> None:
    return None


def _mode_known(cmd: Command, modes: ModeTable | None) -> None:
    check_mode(str(cmd.params["mode"]), modes)


@dataclass(frozen=True, slots=True, kw_only=True)
class CommandDef:
    """One command: what it takes (the wire spec), when it may run, what it does.

    - `flight_state`: it changes what the vehicle does in the air, so it is
      refused while a failsafe is active unless `failsafe_exempt` says so;
    - `check`: validation against the vehicle's tables that makes the
      command `invalid` (not `rejected`): a mode the vehicle does not have;
    - `precondition`: why it must not be sent now (→ `rejected`), or None;
    - `action`: what it does to the vehicle;
    - `recovery`: what a redelivery does when the command was in flight at
      a gateway crash (confirm from the vehicle's state, re-send, or end
      `unknown`; `mavjet.gateway.commands.recovery`).
    """

    wire: CommandSpec
    action: Action
    recovery: Recovery = UNOBSERVABLE
    precondition: Precondition = no_precondition
    flight_state: bool = False
    failsafe_exempt: Callable[[Command, LiveState], bool] = _never
    check: VehicleCheck = _no_check

    @property
    def name(self) -> str:
        return self.wire.name.value

    def failure(self, cmd: Command, state: LiveState) -> str | None:
        """Why `cmd` must not be sent now (→ cmd_result `rejected`), or None when it may be."""
        if self.flight_state and state.failsafe_active and not self.failsafe_exempt(cmd, state):
            return failsafe_refusal(cmd)
        return self.precondition(cmd, state)


def _mav(build: Callable[[Command, ModeTable | None], MavAction], reasons: tuple[str, ...] = (), *,
         temporary_is_final: bool = False) -> MavCommand:
    return MavCommand(build, reasons, temporary_is_final)


# The status texts in which the autopilot explains a refused arm, disarm or takeoff: ArduPilot's
# "PreArm:" / "Arm:" / "Disarm:", PX4's Commander "Arming denied: ...", "Preflight Fail: ...",
# "Disarming denied: ...", "Takeoff denied: ...".
_ARMING_REASONS = ("PreArm:", "Arm:", "Disarm:", "Arming denied", "Preflight Fail", "Disarming denied",
                   "Takeoff denied")


_N = CommandName
_W = CATALOGUE

_DEFS = (
    CommandDef(
        wire=_W[_N.ARM], recovery=Recovery(observe=armed_is(True), resend=True, rule="armed: confirmed; disarmed: sent again"), flight_state=True,
        action=_mav(lambda c, m: MavAction(command=mavlink2.MAV_CMD_COMPONENT_ARM_DISARM, params=(1.0,)),
                    _ARMING_REASONS, temporary_is_final=True),
    ),
    CommandDef(
        wire=_W[_N.DISARM], recovery=Recovery(observe=armed_is(False), resend=True, rule="disarmed: confirmed; armed: sent again"),
        action=_mav(lambda c, m: MavAction(
            command=mavlink2.MAV_CMD_COMPONENT_ARM_DISARM,
            params=autopilot.arm_params(False, force=bool(c.params.get("force"))),
        ), _ARMING_REASONS, temporary_is_final=True),
    ),
    CommandDef(
        wire=_W[_N.TAKEOFF], recovery=Recovery(observe=airborne, resend=False, rule="airborne: confirmed; on the ground: `unknown` (it may be spooling up), not re-sent"), flight_state=True, precondition=takeoff_failure,
        action=_mav(lambda c, m: MavAction(
            # alt_m above home: placed per flavour at send (actions.place_altitude; PX4 reads it AMSL)
            command=mavlink2.MAV_CMD_NAV_TAKEOFF, params=(0.0, 0.0, 0.0, math.nan, math.nan, math.nan, c.params["alt_m"]),
            above_home=True,
        ), _ARMING_REASONS, temporary_is_final=True),
    ),
    CommandDef(
        wire=_W[_N.LAND], recovery=Recovery(observe=mode_contains("LAND"), resend=True, rule="in a LAND mode: confirmed; otherwise sent again (landing twice is harmless)"),
        action=_mav(lambda c, m: MavAction(command=mavlink2.MAV_CMD_NAV_LAND,
                                           params=(0.0, 0.0, 0.0, math.nan, 0.0, 0.0, 0.0))),
    ),
    CommandDef(wire=_W[_N.RTL], recovery=Recovery(observe=mode_contains("RTL"), resend=True, rule="in an RTL mode: confirmed; otherwise sent again (harmless)"), action=_mav(lambda c, m: MavAction(command=mavlink2.MAV_CMD_NAV_RETURN_TO_LAUNCH))),
    CommandDef(
        wire=_W[_N.SET_MODE], recovery=Recovery(observe=mode_is_requested, resend=True, rule="in the requested mode: confirmed; otherwise sent again"), flight_state=True, failsafe_exempt=to_recovery_mode, check=_mode_known,
        action=_mav(lambda c, m: MavAction(command=mavlink2.MAV_CMD_DO_SET_MODE,
                                           params=set_mode_params(str(c.params["mode"]), m))),
    ),
    CommandDef(
        wire=_W[_N.GOTO], recovery=Recovery(observe=at_target, resend=False, rule="within 5 m (3 m vertically) of the target: confirmed; otherwise `unknown` (it may be on its way), not re-sent"), flight_state=True, precondition=goto_failure,
        action=_mav(lambda c, m: MavAction(
            command=mavlink2.MAV_CMD_DO_REPOSITION,
            # speed default, change to GUIDED, no radius, keep yaw; x/y/z: the target, z above home (placed
            # per flavour at send: PX4 reads z AMSL whatever the frame, actions.place_altitude)
            params=(-1.0, float(mavlink2.MAV_DO_REPOSITION_FLAGS_CHANGE_MODE), 0.0, math.nan,
                    c.params["lat_deg"], c.params["lon_deg"], c.params["alt_m"]),
            use_int=True,
            frame=mavlink2.MAV_FRAME_GLOBAL_RELATIVE_ALT_INT,
            above_home=True,
        )),
    ),
    CommandDef(wire=_W[_N.PARAM_SET], recovery=Recovery(observe=param_has_value, resend=True, rule="the parameter is read: at the value, confirmed; otherwise set again"), action=param_set),
    CommandDef(wire=_W[_N.PARAM_GET], recovery=Recovery(observe=no_effect, resend=True, rule="a read: read again"), action=param_get),
    CommandDef(wire=_W[_N.MISSION_UPLOAD], recovery=Recovery(observe=mission_matches_plan, resend=True, rule="the lists are downloaded: digests match the plan, confirmed; otherwise uploaded again (an upload replaces the whole list)"), action=mission_upload),
    CommandDef(wire=_W[_N.MISSION_CLEAR], recovery=Recovery(observe=mission_empty, resend=True, rule="the mission is downloaded: empty, confirmed; otherwise cleared again"), action=mission_clear),
    CommandDef(wire=_W[_N.MISSION_DOWNLOAD], recovery=Recovery(observe=no_effect, resend=True, rule="a read: read again"), action=mission_download),
    CommandDef(
        wire=_W[_N.MISSION_START], recovery=Recovery(observe=mode_contains_or_unknown("AUTO"), resend=False, rule="in AUTO: confirmed; otherwise `unknown` (starting again restarts the mission), not re-sent"), flight_state=True,
        action=_mav(lambda c, m: MavAction(command=mavlink2.MAV_CMD_MISSION_START, params=(0.0, 0.0))),
    ),
    CommandDef(
        wire=_W[_N.REBOOT], flight_state=True, precondition=reboot_failure,
        action=_mav(lambda c, m: MavAction(command=mavlink2.MAV_CMD_PREFLIGHT_REBOOT_SHUTDOWN, params=(1.0,))),
    ),
    # Accepted once started; the download runs beside the command queue (mavjet.gateway.commands.logs).
    CommandDef(wire=_W[_N.LOG_DOWNLOAD], precondition=log_download_failure, action=log_download,
               recovery=Recovery(observe=no_effect, resend=True, rule="starting a download again is harmless")),
    CommandDef(wire=_W[_N.LOG_LIST], precondition=log_list_failure, action=log_list,
               recovery=Recovery(observe=no_effect, resend=True, rule="a read: list again")),
)

COMMANDS: dict[str, CommandDef] = {d.name: d for d in _DEFS}


def command_def(name: str) -> CommandDef:
    found = COMMANDS.get(name)
    if found is None:
        raise CommandInvalid(f"unknown command {name!r} (known: {', '.join(CATALOGUE)})", name=name)
    return found


def decode(
    name: str, payload: bytes, modes: ModeTable | None, *, max_payload_bytes: int, fallback_id: str
) -> tuple[Command, CommandDef]:
    """An untrusted command message → the command and its definition, or CommandInvalid. Nothing else escapes.

    The contract's decoder already turns every failure into CommandInvalid;
    this is the last line behind it: an exception here would leave the
    message unanswered, and with MaxAckPending 1 the vehicle's queue would
    wait for AckWait x MaxDeliver.
    """
    cmd_id = fallback_id
    try:
        cmd = decode_command(name, payload, max_payload_bytes=max_payload_bytes, fallback_id=fallback_id)
        cmd_id = cmd.cmd_id
        defn = command_def(cmd.name)
        defn.check(cmd, modes)
    except CommandInvalid as exc:
        if exc.cmd_id is None:  # the result names the command by the best id known
            raise CommandInvalid(exc.reason, cmd_id=cmd_id, name=exc.name or name) from None
        raise
    except Exception as exc:  # a decoder bug must still end in `invalid`, with what is known
        why = str(exc)[:200] or type(exc).__name__
        raise CommandInvalid(f"{name}: body could not be decoded ({type(exc).__name__}: {why})",
                             cmd_id=cmd_id, name=name) from exc
    return cmd, defn


def precondition_failure(cmd: Command, state: LiveState) -> str | None:
    """Why `cmd` must not be sent now (→ cmd_result `rejected`), or None when it may be."""
    return command_def(cmd.name).failure(cmd, state)


def mav_action(cmd: Command, modes: ModeTable | None) -> MavAction:
    """The MAV_CMD `cmd` becomes (only for commands whose action is one MAV_CMD)."""
    action = command_def(cmd.name).action
    if not isinstance(action, MavCommand):
        raise CommandInvalid(f"{cmd.name} is not a MAV_CMD command", cmd_id=cmd.cmd_id, name=cmd.name)
    return action.build(cmd, modes)
