"""The command catalogue: names, parameters, body format, preconditions. Pure.

Everything an operator can get wrong is decided here, without I/O, so every
rule is unit-tested with plain dicts and bytes and every rejection says what
is wrong ("takeoff: alt_m 900 outside [1, 500] m"):

- the body (DESIGN.md, Commands): msgpack `{"id", "issued": Timestamp,
  "deadline": Timestamp | absent, "params": {...}, "issuer"}`;
- each command's parameters (SI units, unit in the name), with ranges;
- preconditions against the live vehicle model (takeoff needs armed and a
  mode that accepts it, reboot needs disarmed, nothing that changes the
  flight state while a failsafe is active except land, rtl and disarm);
- the MAV_CMD a command becomes (`mav_action`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgpack

from drivers.mavlink.dialect import mavlink2
from drivers.mavlink.modes import ModeTable, UnknownMode
from gateway.contract.errors import MavjetError

MAX_ID_LEN = 128
MAX_ISSUER_LEN = 128
PARAM_NAME = re.compile(r"^[A-Z0-9_]{1,16}$")
OBJECT_NAME = re.compile(r"^[A-Za-z0-9_\-][A-Za-z0-9_\-./]{0,254}$")
ALT_RANGE_M = (1.0, 500.0)
FORCE_DISARM_MAGIC = 21196.0  # MAV_CMD_COMPONENT_ARM_DISARM param2: disarm even in flight


class CommandInvalid(MavjetError):
    """A command message cannot be executed as sent; `reason` says what is wrong.

    `cmd_id` and `name` are whatever could be read before the problem (None
    when not even that), so the `cmd_result` can still name the command.
    """

    def __init__(self, reason: str, *, cmd_id: str | None = None, name: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.cmd_id = cmd_id
        self.name = name


# ---------------------------------------------------------------------------
# parameters


@dataclass(frozen=True, slots=True, kw_only=True)
class ParamSpec:
    """One parameter of a command. `kind` is float, int, bool or str."""

    name: str
    kind: type
    required: bool = True
    lo: float | None = None
    hi: float | None = None
    unit: str = ""
    pattern: re.Pattern[str] | None = None
    pattern_text: str = ""
    default: Any = None

    def check(self, command: str, value: Any) -> Any:
        """Return the normalised value, or raise CommandInvalid saying what is wrong."""
        where = f"{command}: {self.name}"
        if self.kind is bool:
            if not isinstance(value, bool):
                raise CommandInvalid(f"{where} must be true or false, got {value!r}")
            return value
        if self.kind is str:
            if not isinstance(value, str):
                raise CommandInvalid(f"{where} must be a string, got {type(value).__name__} {value!r}")
            if self.pattern is not None and not self.pattern.match(value):
                raise CommandInvalid(f"{where} {value!r} is not {self.pattern_text}")
            return value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise CommandInvalid(f"{where} must be a number, got {type(value).__name__} {value!r}")
        number = float(value)
        if not math.isfinite(number):
            raise CommandInvalid(f"{where} must be finite, got {value!r}")
        if self.kind is int and not number.is_integer():
            raise CommandInvalid(f"{where} must be an integer, got {value!r}")
        unit = f" {self.unit}" if self.unit else ""
        if (self.lo is not None and number < self.lo) or (self.hi is not None and number > self.hi):
            raise CommandInvalid(f"{where} {_num(number)} outside [{_num(self.lo)}, {_num(self.hi)}]{unit}")
        return int(number) if self.kind is int else number

    def parse_text(self, command: str, text: str) -> Any:
        """A value typed on a command line (`--param alt_m=20`) in this parameter's type."""
        if self.kind is str:
            return text
        if self.kind is bool:
            low = text.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise CommandInvalid(f"{command}: {self.name} must be true or false, got {text!r}")
        try:
            return int(text) if self.kind is int else float(text)
        except ValueError:
            raise CommandInvalid(f"{command}: {self.name} must be a number, got {text!r}") from None


def _num(v: float | None) -> str:
    if v is None:
        return "-inf"
    return str(int(v)) if float(v).is_integer() else str(v)


def _alt(required: bool = True) -> ParamSpec:
    return ParamSpec(name="alt_m", kind=float, lo=ALT_RANGE_M[0], hi=ALT_RANGE_M[1], unit="m", required=required)


LAT = ParamSpec(name="lat_deg", kind=float, lo=-90.0, hi=90.0, unit="deg")
LON = ParamSpec(name="lon_deg", kind=float, lo=-180.0, hi=180.0, unit="deg")
PARAM_ID = ParamSpec(
    name="name", kind=str, pattern=PARAM_NAME, pattern_text="a parameter name (1-16 characters A-Z, 0-9, _)"
)
MODE = ParamSpec(name="mode", kind=str, pattern=re.compile(r"^[A-Za-z0-9_.]{1,32}$"), pattern_text="a mode name")
OBJECT = ParamSpec(
    name="object", kind=str, pattern=OBJECT_NAME, pattern_text="an object name in TWIN_BLOBS (e.g. missions/survey.plan)"
)


# ---------------------------------------------------------------------------
# the catalogue


@dataclass(frozen=True, slots=True, kw_only=True)
class CommandSpec:
    name: str
    summary: str
    params: tuple[ParamSpec, ...] = ()
    # Changes what the vehicle does in the air: refused while a failsafe is active.
    flight_state: bool = False
    allowed_in_failsafe: bool = False

    def param(self, key: str) -> ParamSpec:
        for p in self.params:
            if p.name == key:
                return p
        raise CommandInvalid(f"{self.name}: unknown parameter {key!r} ({self.allowed()})", name=self.name)

    def allowed(self) -> str:
        if not self.params:
            return "it takes no parameters"
        return "allowed: " + ", ".join(p.name + ("" if p.required else "?") for p in self.params)


CATALOGUE: dict[str, CommandSpec] = {
    s.name: s
    for s in (
        CommandSpec(name="arm", summary="arm the motors", flight_state=True),
        CommandSpec(
            name="disarm",
            summary="disarm (force=true disarms even in flight)",
            params=(ParamSpec(name="force", kind=bool, required=False, default=False),),
            allowed_in_failsafe=True,
        ),
        CommandSpec(name="takeoff", summary="take off to alt_m above home", params=(_alt(),), flight_state=True),
        CommandSpec(name="land", summary="land where the vehicle is", allowed_in_failsafe=True),
        CommandSpec(name="rtl", summary="return to launch", allowed_in_failsafe=True),
        CommandSpec(name="set_mode", summary="switch flight mode (names from the flavour's table)",
                    params=(MODE,), flight_state=True),
        CommandSpec(name="goto", summary="fly to lat_deg/lon_deg at alt_m above home",
                    params=(LAT, LON, _alt()), flight_state=True),
        CommandSpec(name="param_set", summary="set a parameter and confirm the value",
                    params=(PARAM_ID, ParamSpec(name="value", kind=float))),
        CommandSpec(name="param_get", summary="read a parameter", params=(PARAM_ID,)),
        CommandSpec(name="mission_upload", summary="upload a .plan from TWIN_BLOBS and verify it",
                    params=(OBJECT,)),
        CommandSpec(name="mission_clear", summary="clear the vehicle's mission"),
        CommandSpec(name="mission_start", summary="start the uploaded mission (AUTO)", flight_state=True),
        CommandSpec(name="reboot", summary="reboot the autopilot (only when disarmed)", flight_state=True),
    )
}


def spec_for(name: str) -> CommandSpec:
    spec = CATALOGUE.get(name)
    if spec is None:
        raise CommandInvalid(f"unknown command {name!r} (known: {', '.join(CATALOGUE)})", name=name)
    return spec


def validate_params(name: str, params: Any) -> dict[str, Any]:
    """Check a command's params against the catalogue; returns them normalised with defaults."""
    spec = spec_for(name)
    if params is None:
        params = {}
    if not isinstance(params, Mapping):
        raise CommandInvalid(f"{name}: 'params' must be a map, got {type(params).__name__}", name=name)
    out: dict[str, Any] = {}
    for key, value in params.items():
        if not isinstance(key, str):
            raise CommandInvalid(f"{name}: parameter names must be strings, got {key!r}", name=name)
        try:
            out[key] = spec.param(key).check(name, value)
        except CommandInvalid as exc:
            raise CommandInvalid(exc.reason, name=name) from None
    for p in spec.params:
        if p.name not in out:
            if p.required:
                raise CommandInvalid(f"{name}: missing parameter {p.name!r} ({spec.allowed()})", name=name)
            out[p.name] = p.default
    return out


def parse_cli_params(name: str, pairs: list[str]) -> dict[str, Any]:
    """`["alt_m=20", "force=true"]` → typed params, validated."""
    spec = spec_for(name)
    raw: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise CommandInvalid(f"{name}: --param expects key=value, got {pair!r}", name=name)
        raw[key.strip()] = spec.param(key.strip()).parse_text(name, text.strip())
    validate_params(name, raw)
    return raw


# ---------------------------------------------------------------------------
# the body


@dataclass(frozen=True, slots=True, kw_only=True)
class Command:
    """A decoded, validated command message."""

    cmd_id: str
    name: str
    issued_ns: int
    deadline_ns: int | None
    params: dict[str, Any] = field(default_factory=dict)
    issuer: str = ""

    def expired(self, now_ns: int) -> bool:
        return self.deadline_ns is not None and now_ns > self.deadline_ns


def encode_command(
    cmd_id: str, params: Mapping[str, Any], *, issued_ns: int, deadline_ns: int | None = None, issuer: str = ""
) -> bytes:
    """The body of a command message (the publisher also sets Nats-Msg-Id = cmd_id)."""
    body: dict[str, Any] = {
        "id": cmd_id,
        "issued": msgpack.Timestamp.from_unix_nano(issued_ns),
        "params": dict(params),
        "issuer": issuer,
    }
    if deadline_ns is not None:
        body["deadline"] = msgpack.Timestamp.from_unix_nano(deadline_ns)
    return msgpack.packb(body, use_bin_type=True)


def _timestamp_ns(value: Any, key: str, cmd_id: str, name: str) -> int:
    if isinstance(value, msgpack.Timestamp):
        return int(value.to_unix_nano())
    raise CommandInvalid(f"{name}: '{key}' must be a msgpack Timestamp, got {type(value).__name__}",
                         cmd_id=cmd_id, name=name)


def decode_command(name: str, payload: bytes, *, max_payload_bytes: int, fallback_id: str | None = None) -> Command:
    """Decode and validate one command message for command `name` (the last subject token).

    `fallback_id` (the Nats-Msg-Id header, or the stream sequence) names the
    command in the rejection when the body has no usable id.
    """
    if len(payload) > max_payload_bytes:
        raise CommandInvalid(f"{name}: payload of {len(payload)} bytes exceeds the {max_payload_bytes}-byte limit",
                             cmd_id=fallback_id, name=name)
    try:
        body = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise CommandInvalid(f"{name}: body is not msgpack ({exc})", cmd_id=fallback_id, name=name) from None
    if not isinstance(body, dict):
        raise CommandInvalid(f"{name}: body must be a msgpack map, got {type(body).__name__}",
                             cmd_id=fallback_id, name=name)
    cmd_id = body.get("id")
    if not isinstance(cmd_id, str) or not 0 < len(cmd_id) <= MAX_ID_LEN:
        raise CommandInvalid(f"{name}: 'id' must be a string of 1-{MAX_ID_LEN} characters", cmd_id=fallback_id, name=name)
    if "issued" not in body:
        raise CommandInvalid(f"{name}: 'issued' is missing", cmd_id=cmd_id, name=name)
    issued_ns = _timestamp_ns(body["issued"], "issued", cmd_id, name)
    deadline = body.get("deadline")
    deadline_ns = None if deadline is None else _timestamp_ns(deadline, "deadline", cmd_id, name)
    issuer = body.get("issuer", "")
    if not isinstance(issuer, str) or len(issuer) > MAX_ISSUER_LEN:
        raise CommandInvalid(f"{name}: 'issuer' must be a string of at most {MAX_ISSUER_LEN} characters",
                             cmd_id=cmd_id, name=name)
    unknown = set(body) - {"id", "issued", "deadline", "params", "issuer"}
    if unknown:
        raise CommandInvalid(f"{name}: unknown body keys {sorted(map(str, unknown))}", cmd_id=cmd_id, name=name)
    try:
        params = validate_params(name, body.get("params"))
    except CommandInvalid as exc:
        raise CommandInvalid(exc.reason, cmd_id=cmd_id, name=name) from None
    return Command(cmd_id=cmd_id, name=name, issued_ns=issued_ns, deadline_ns=deadline_ns, params=params, issuer=issuer)


# ---------------------------------------------------------------------------
# preconditions against the live model


class LiveState(Protocol):
    """What preconditions read from `gateway.telemetry.VehicleModel`."""

    armed: bool | None
    mode: str | None
    failsafe_active: bool
    landed_state: int | None
    flavour: str
    vehicle_class: str
    modes: ModeTable | None


_AIRBORNE = (mavlink2.MAV_LANDED_STATE_IN_AIR, mavlink2.MAV_LANDED_STATE_TAKEOFF)
# Modes in which an ArduPilot vehicle accepts MAV_CMD_NAV_TAKEOFF.
ARDUPILOT_TAKEOFF_MODES: dict[str, frozenset[str]] = {
    "copter": frozenset({"GUIDED"}),
    "plane": frozenset({"GUIDED", "TAKEOFF", "AUTO"}),
}


def check_mode(mode: str, modes: ModeTable | None) -> str:
    """The canonical mode name, or CommandInvalid listing the vehicle's modes."""
    if modes is None or not modes.names():
        return mode.strip().upper()
    try:
        modes.custom_mode(mode)
    except UnknownMode as exc:
        raise CommandInvalid(f"set_mode: {exc}", name="set_mode") from None
    return mode.strip().upper()


def precondition_failure(cmd: Command, state: LiveState) -> str | None:
    """Why `cmd` must not be sent now (→ cmd_result `rejected`), or None when it may be."""
    name = cmd.name
    spec = spec_for(name)
    if state.failsafe_active and spec.flight_state:
        is_recovery_mode = (
            name == "set_mode" and state.modes is not None and state.modes.is_recovery(str(cmd.params["mode"]).upper())
        )
        if not is_recovery_mode:
            return f"{name} refused: a failsafe is active (only land, rtl and disarm are accepted)"
    if name == "takeoff":
        if not state.armed:
            return "takeoff needs the vehicle armed"
        if state.landed_state in _AIRBORNE:
            return "takeoff refused: the vehicle is already in the air"
        if state.flavour == "ardupilot":
            accepted = ARDUPILOT_TAKEOFF_MODES.get(state.vehicle_class)
            if accepted is None:
                return f"takeoff is not possible for a {state.vehicle_class}"
            if state.mode not in accepted:
                return f"takeoff needs mode {' or '.join(sorted(accepted))}, the vehicle is in {state.mode}"
        elif state.flavour == "px4" and state.modes is not None and state.mode and state.modes.is_recovery(state.mode):
            return f"takeoff refused in recovery mode {state.mode}"
    if name == "goto" and not state.armed:
        return "goto needs the vehicle armed (and flying)"
    if name == "reboot" and state.armed is not False:
        return "reboot needs the vehicle disarmed" if state.armed else "reboot needs a known disarmed state"
    return None


# ---------------------------------------------------------------------------
# MAVLink mapping


@dataclass(frozen=True, slots=True, kw_only=True)
class MavAction:
    """A MAV_CMD with its params (param1..param7), sent as COMMAND_LONG or COMMAND_INT."""

    command: int
    params: tuple[float, ...] = ()
    use_int: bool = False
    frame: int | None = None


def _set_mode_params(mode: str, modes: ModeTable | None) -> tuple[float, ...]:
    if modes is None:
        raise CommandInvalid("set_mode: the vehicle's mode table is not known yet (no HEARTBEAT)", name="set_mode")
    try:
        custom = modes.custom_mode(mode)
    except UnknownMode as exc:
        raise CommandInvalid(f"set_mode: {exc}", name="set_mode") from None
    base = float(mavlink2.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED)
    if modes.flavour.value == "px4":
        return (base, float((custom >> 16) & 0xFF), float((custom >> 24) & 0xFF))
    return (base, float(custom))


_SIMPLE: dict[str, Callable[[Command], MavAction]] = {
    "arm": lambda c: MavAction(command=mavlink2.MAV_CMD_COMPONENT_ARM_DISARM, params=(1.0,)),
    "disarm": lambda c: MavAction(
        command=mavlink2.MAV_CMD_COMPONENT_ARM_DISARM,
        params=(0.0, FORCE_DISARM_MAGIC if c.params.get("force") else 0.0),
    ),
    "takeoff": lambda c: MavAction(
        command=mavlink2.MAV_CMD_NAV_TAKEOFF, params=(0.0, 0.0, 0.0, math.nan, math.nan, math.nan, c.params["alt_m"])
    ),
    "land": lambda c: MavAction(command=mavlink2.MAV_CMD_NAV_LAND, params=(0.0, 0.0, 0.0, math.nan, 0.0, 0.0, 0.0)),
    "rtl": lambda c: MavAction(command=mavlink2.MAV_CMD_NAV_RETURN_TO_LAUNCH),
    "goto": lambda c: MavAction(
        command=mavlink2.MAV_CMD_DO_REPOSITION,
        # speed default, change to GUIDED, no radius, keep yaw; x/y/z: the target
        params=(-1.0, float(mavlink2.MAV_DO_REPOSITION_FLAGS_CHANGE_MODE), 0.0, math.nan,
                c.params["lat_deg"], c.params["lon_deg"], c.params["alt_m"]),
        use_int=True,
        frame=mavlink2.MAV_FRAME_GLOBAL_RELATIVE_ALT_INT,
    ),
    "mission_start": lambda c: MavAction(command=mavlink2.MAV_CMD_MISSION_START, params=(0.0, 0.0)),
    "reboot": lambda c: MavAction(command=mavlink2.MAV_CMD_PREFLIGHT_REBOOT_SHUTDOWN, params=(1.0,)),
}

#: Commands the executor runs with another protocol than COMMAND_LONG/INT.
SPECIAL = frozenset({"param_set", "param_get", "mission_upload", "mission_clear"})


def mav_action(cmd: Command, modes: ModeTable | None) -> MavAction:
    """The MAV_CMD for `cmd` (not for the SPECIAL commands)."""
    if cmd.name == "set_mode":
        return MavAction(command=mavlink2.MAV_CMD_DO_SET_MODE, params=_set_mode_params(str(cmd.params["mode"]), modes))
    builder = _SIMPLE.get(cmd.name)
    if builder is None:
        raise CommandInvalid(f"{cmd.name} is not a MAV_CMD command", cmd_id=cmd.cmd_id, name=cmd.name)
    return builder(cmd)


# ---------------------------------------------------------------------------
# results

RESULTS = ("accepted", "rejected", "failed", "expired", "invalid", "timeout")


def result_data(
    *,
    cmd_id: str,
    name: str,
    result: str,
    mav_result: int | None = None,
    detail: str = "",
    attempts: int = 0,
    latency_ms: float = 0.0,
    **extra: Any,
) -> dict[str, Any]:
    """The type-specific fields of a `cmd_result` event (docs/events.md)."""
    if result not in RESULTS:
        raise ValueError(f"unknown cmd_result {result!r}")
    data: dict[str, Any] = {
        "cmd_id": cmd_id,
        "name": name,
        "result": result,
        "mav_result": mav_result,
        "detail": detail,
        "attempts": attempts,
        "latency_ms": round(max(0.0, latency_ms), 3),
    }
    data.update(extra)
    return data
