"""Preconditions against the live vehicle model. Pure.

A precondition says why a command must not be sent now (→ `cmd_result`
`rejected`, nothing sent), or None. The rules are plain functions of the
command and the model so each one is unit-tested with a small dataclass;
which rule belongs to which command is decided once, in `spec.COMMANDS`.
"""

from __future__ import annotations

from mavjet.contract.commands import Command, CommandInvalid, CommandName
from mavjet.drivers.mavlink.autopilot import is_airborne
from mavjet.drivers.mavlink.modes import (
    ARDUPILOT_TAKEOFF_MODES,
    Flavour,
    ModeTable,
    UnknownMode,
    canonical_mode,
)
from mavjet.gateway.services import LiveState


def check_mode(mode: str, modes: ModeTable | None) -> str:
    """The canonical mode name, or CommandInvalid listing the vehicle's modes."""
    if modes is None or not modes.names():
        return canonical_mode(mode)
    try:
        modes.custom_mode(mode)
    except UnknownMode as exc:
        raise CommandInvalid(f"{CommandName.SET_MODE}: {exc}", name=CommandName.SET_MODE) from None
    return canonical_mode(mode)


def failsafe_refusal(cmd: Command) -> str:
    """Why a command that changes the flight state is refused while a failsafe is active."""
    return f"{cmd.name} refused: a failsafe is active (only land, rtl and disarm are accepted)"


def to_recovery_mode(cmd: Command, state: LiveState) -> bool:
    """set_mode to a recovery mode (RTL, LAND...) is allowed during a failsafe."""
    return state.modes is not None and state.modes.is_recovery(canonical_mode(str(cmd.params["mode"])))


def takeoff_failure(cmd: Command, state: LiveState) -> str | None:
    if not state.armed:
        return "takeoff needs the vehicle armed"
    if is_airborne(state.landed_state):
        return "takeoff refused: the vehicle is already in the air"
    if state.flavour == Flavour.ARDUPILOT:
        accepted = ARDUPILOT_TAKEOFF_MODES.get(state.vehicle_class)
        if accepted is None:
            return f"takeoff is not possible for a {state.vehicle_class}"
        if state.mode not in accepted:
            return f"takeoff needs mode {' or '.join(sorted(accepted))}, the vehicle is in {state.mode}"
    elif state.flavour == Flavour.PX4 and state.modes is not None and state.mode and state.modes.is_recovery(state.mode):
        return f"takeoff refused in recovery mode {state.mode}"
    return None


def goto_failure(cmd: Command, state: LiveState) -> str | None:
    return None if state.armed else "goto needs the vehicle armed (and flying)"


def reboot_failure(cmd: Command, state: LiveState) -> str | None:
    if state.armed is False:
        return None
    return "reboot needs the vehicle disarmed" if state.armed else "reboot needs a known disarmed state"


def log_download_failure(cmd: Command, state: LiveState) -> str | None:
    # ArduPilot answers "Disarm for log download" and sends nothing while armed.
    if state.armed is False:
        return None
    why = "the vehicle is armed" if state.armed else "its armed state is unknown"
    return f"log_download needs the vehicle disarmed ({why}; the autopilot sends no log data while armed)"


def no_precondition(cmd: Command, state: LiveState) -> str | None:
    return None
