"""The command wire format: names, parameters, the body codec, results. Pure.

What a publisher and the gateway must agree on, and nothing else, so that a
client (`mavjet cmd`, a ground station) validates exactly as the gateway
does without importing the daemon:

- the command names and their parameters (SI units, unit in the name), with
  ranges, and every rejection says what is wrong ("takeoff: alt_m 900
  outside [1, 500] m");
- the body: msgpack `{"id", "issued": Timestamp, "deadline": Timestamp |
  absent, "params": {...}, "issuer"}`;
- the result kinds of a `cmd_result` event and its type-specific fields.

What a command needs of the vehicle (preconditions) and how it is executed
live in `mavjet.gateway.commands.spec`, one entry per name listed here.

One module on purpose: it is the catalogue, one entry per command with its
params and ranges, which clients and the gateway must read from one table.
"""

from __future__ import annotations

import math
import re
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import msgpack

from mavjet.contract.errors import MavjetError

MAX_ID_LEN = 128
MAX_ISSUER_LEN = 128
# Use with fullmatch (a `$` alone would accept a trailing newline).
PARAM_NAME = re.compile(r"^[A-Z0-9_]{1,16}$")
OBJECT_NAME = re.compile(r"^[A-Za-z0-9_\-][A-Za-z0-9_\-./]{0,254}$")
ALT_RANGE_M = (1.0, 500.0)
# The largest finite IEEE-754 single: a MAVLink parameter value travels as a float32, so a
# larger magnitude (1e308) cannot be sent at all and is the body's fault, not the vehicle's.
FLOAT32_MAX = 3.4028234663852886e38
BODY_KEYS = frozenset({"id", "issued", "deadline", "params", "issuer"})
# A command id becomes part of a Nats-Msg-Id header and of the result's msg id: no spaces, no control characters.
COMMAND_ID = re.compile(rf"^[\x21-\x7e]{{1,{MAX_ID_LEN}}}$")

# Values quoted in a reason come from an untrusted body: bounded in length and depth (a 1000-deep
# nested list must not hit the recursion limit, a 60 kB string must not become a 60 kB reason).
_QUOTE = reprlib.Repr()
_QUOTE.maxstring = _QUOTE.maxother = 64
_QUOTE.maxlevel = 3


def quote(value: Any) -> str:
    """`repr(value)` for an error message, shortened when long or deep."""
    return _QUOTE.repr(value)


class CommandName(StrEnum):
    """Every command a gateway executes (the last token of `...cmd.<name>`)."""

    ARM = "arm"
    DISARM = "disarm"
    TAKEOFF = "takeoff"
    LAND = "land"
    RTL = "rtl"
    SET_MODE = "set_mode"
    GOTO = "goto"
    PARAM_SET = "param_set"
    PARAM_GET = "param_get"
    MISSION_UPLOAD = "mission_upload"
    MISSION_CLEAR = "mission_clear"
    MISSION_START = "mission_start"
    MISSION_DOWNLOAD = "mission_download"
    REBOOT = "reboot"
    LOG_DOWNLOAD = "log_download"
    LOG_LIST = "log_list"


class CmdResult(StrEnum):
    """The `result` field of a `cmd_result` event (docs/events.md). Exactly one per command."""

    ACCEPTED = "accepted"
    REJECTED = "rejected"
    FAILED = "failed"
    EXPIRED = "expired"
    INVALID = "invalid"
    TIMEOUT = "timeout"
    UNKNOWN = "unknown"  # in flight when its gateway stopped and the vehicle's state cannot tell: not re-sent


RESULTS = tuple(r.value for r in CmdResult)


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
    float32: bool = False  # the value travels as a MAVLink float32 (PARAM_SET): bounded by FLOAT32_MAX

    def check(self, command: str, value: Any) -> Any:
        """Return the normalised value, or raise CommandInvalid saying what is wrong."""
        where = f"{command}: {self.name}"
        if self.kind is bool:
            if not isinstance(value, bool):
                raise CommandInvalid(f"{where} must be true or false, got {quote(value)}")
            return value
        if self.kind is str:
            if not isinstance(value, str):
                raise CommandInvalid(f"{where} must be a string, got {type(value).__name__} {quote(value)}")
            if self.pattern is not None and not self.pattern.fullmatch(value):  # fullmatch: `$` allows a final newline
                raise CommandInvalid(f"{where} {quote(value)} is not {self.pattern_text}")
            return value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise CommandInvalid(f"{where} must be a number, got {type(value).__name__} {quote(value)}")
        number = float(value)
        if not math.isfinite(number):
            raise CommandInvalid(f"{where} must be finite, got {quote(value)}")
        if self.float32 and abs(number) > FLOAT32_MAX:
            raise CommandInvalid(f"{where} {number:g} does not fit a MAVLink float32 (|value| <= {FLOAT32_MAX:.7g})")
        if self.kind is int and not number.is_integer():
            raise CommandInvalid(f"{where} must be an integer, got {quote(value)}")
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

LOG_ID = ParamSpec(
    # PX4 numbers its logs from 0, ArduPilot from 1 (LOG_ENTRY.id).
    name="log", kind=str, required=False, default="latest", pattern=re.compile(r"^(latest|0|[1-9][0-9]{0,4})$"),
    pattern_text="a log id (0-65535) or latest",
)


# ---------------------------------------------------------------------------
# the catalogue (wire side)


@dataclass(frozen=True, slots=True, kw_only=True)
class CommandSpec:
    """A command as a publisher sees it: its name, what it does, its parameters."""

    name: CommandName
    summary: str
    params: tuple[ParamSpec, ...] = ()

    def param(self, key: str) -> ParamSpec:
        for p in self.params:
            if p.name == key:
                return p
        raise CommandInvalid(f"{self.name}: unknown parameter {quote(key)} ({self.allowed()})", name=self.name)

    def allowed(self) -> str:
        if not self.params:
            return "it takes no parameters"
        return "allowed: " + ", ".join(p.name + ("" if p.required else "?") for p in self.params)


_N = CommandName
CATALOGUE: dict[str, CommandSpec] = {
    s.name.value: s
    for s in (
        CommandSpec(name=_N.ARM, summary="arm the motors"),
        CommandSpec(name=_N.DISARM, summary="disarm (force=true disarms even in flight)",
                    params=(ParamSpec(name="force", kind=bool, required=False, default=False),)),
        CommandSpec(name=_N.TAKEOFF, summary="take off to alt_m above home", params=(_alt(),)),
        CommandSpec(name=_N.LAND, summary="land where the vehicle is"),
        CommandSpec(name=_N.RTL, summary="return to launch"),
        CommandSpec(name=_N.SET_MODE, summary="switch flight mode (names from the flavour's table)", params=(MODE,)),
        CommandSpec(name=_N.GOTO, summary="fly to lat_deg/lon_deg at alt_m above home", params=(LAT, LON, _alt())),
        CommandSpec(name=_N.PARAM_SET, summary="set a parameter and confirm the value",
                    params=(PARAM_ID, ParamSpec(name="value", kind=float, float32=True))),
        CommandSpec(name=_N.PARAM_GET, summary="read a parameter", params=(PARAM_ID,)),
        CommandSpec(name=_N.MISSION_UPLOAD, summary="upload a .plan from TWIN_BLOBS and verify it (enables its fence)",
                    params=(OBJECT, ParamSpec(name="enable_fence", kind=bool, required=False, default=True))),
        CommandSpec(name=_N.MISSION_CLEAR, summary="clear the vehicle's mission"),
        CommandSpec(name=_N.MISSION_START, summary="start the uploaded mission (AUTO)"),
        CommandSpec(name=_N.MISSION_DOWNLOAD,
                    summary="read back the vehicle's mission, fence and rally into TWIN_BLOBS as a .plan (`mavjet mission get`)"),
        CommandSpec(name=_N.REBOOT, summary="reboot the autopilot (only when disarmed)"),
        CommandSpec(name=_N.LOG_DOWNLOAD,
                    summary="download a dataflash log into TWIN_LOGS logs/<vid>/ (only when disarmed; runs in the background)",
                    params=(LOG_ID,)),
        CommandSpec(name=_N.LOG_LIST, summary="the vehicle's own list of dataflash logs (LOG_ENTRY), in the cmd_result"),
    )
}


def spec_for(name: str) -> CommandSpec:
    spec = CATALOGUE.get(name)
    if spec is None:
        raise CommandInvalid(f"unknown command {quote(name)} (known: {', '.join(CATALOGUE)})", name=name)
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
            raise CommandInvalid(f"{name}: parameter names must be strings, got {quote(key)}", name=name)
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


def command_msg_id(vid: str, cmd_id: str) -> str:
    """The Nats-Msg-Id of a command message: a command's identity is (vid, cmd_id), so is its de-duplication."""
    return f"{vid}:{cmd_id}"


def effective_deadline_ns(cmd: Command, default_deadline_s: float) -> int | None:
    """The command's deadline: its own, else `issued` + the default (0: none)."""
    if cmd.deadline_ns is not None:
        return cmd.deadline_ns
    if default_deadline_s <= 0:
        return None
    return cmd.issued_ns + int(default_deadline_s * 1e9)


def check_command_id(cmd_id: str) -> str:
    """`cmd_id` if a gateway will accept it as a command id, else CommandInvalid."""
    if not isinstance(cmd_id, str) or not COMMAND_ID.fullmatch(cmd_id):
        raise CommandInvalid(f"command id {quote(cmd_id)} must be 1-{MAX_ID_LEN} printable ASCII characters "
                             "without spaces")
    return cmd_id


def encode_command(
    cmd_id: str, params: Mapping[str, Any], *, issued_ns: int, deadline_ns: int | None = None, issuer: str = ""
) -> bytes:
    """The body of a command message (the publisher also sets Nats-Msg-Id = `command_msg_id(vid, cmd_id)`)."""
    body: dict[str, Any] = {
        "id": cmd_id,
        "issued": msgpack.Timestamp.from_unix_nano(issued_ns),
        "params": dict(params),
        "issuer": issuer,
    }
    if deadline_ns is not None:
        body["deadline"] = msgpack.Timestamp.from_unix_nano(deadline_ns)
    packed: bytes = msgpack.packb(body, use_bin_type=True)
    return packed


def _timestamp_ns(value: Any, key: str, cmd_id: str, name: str) -> int:
    if isinstance(value, msgpack.Timestamp):
        return int(value.to_unix_nano())
    raise CommandInvalid(f"{name}: '{key}' must be a msgpack Timestamp, got {type(value).__name__}",
                         cmd_id=cmd_id, name=name)


def decode_command(name: str, payload: bytes, *, max_payload_bytes: int, fallback_id: str | None = None) -> Command:
    """Decode and validate one command message for command `name` (the last subject token).

    The payload is untrusted: whatever it holds, this returns a Command or
    raises CommandInvalid with a reason, never anything else (a fuzz test
    holds it to that). `fallback_id` (the Nats-Msg-Id header, or the stream
    sequence) names the command in the rejection when the body has no usable id.
    """
    if len(payload) > max_payload_bytes:
        raise CommandInvalid(f"{name}: payload of {len(payload)} bytes exceeds the {max_payload_bytes}-byte limit",
                             cmd_id=fallback_id, name=name)
    try:
        body = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # untrusted bytes: ValueError, StackError, TypeError (a map key that is an array)...
        why = str(exc)[:200] or type(exc).__name__
        raise CommandInvalid(f"{name}: body is not msgpack ({why})", cmd_id=fallback_id, name=name) from None
    if not isinstance(body, dict):
        raise CommandInvalid(f"{name}: body must be a msgpack map, got {type(body).__name__}",
                             cmd_id=fallback_id, name=name)
    cmd_id = body.get("id")
    if not isinstance(cmd_id, str) or not 0 < len(cmd_id) <= MAX_ID_LEN:
        raise CommandInvalid(f"{name}: 'id' must be a string of 1-{MAX_ID_LEN} characters", cmd_id=fallback_id, name=name)
    if not COMMAND_ID.fullmatch(cmd_id):
        raise CommandInvalid(f"{name}: 'id' must be printable ASCII without spaces", cmd_id=fallback_id, name=name)
    if "issued" not in body:
        raise CommandInvalid(f"{name}: 'issued' is missing", cmd_id=cmd_id, name=name)
    issued_ns = _timestamp_ns(body["issued"], "issued", cmd_id, name)
    deadline = body.get("deadline")
    deadline_ns = None if deadline is None else _timestamp_ns(deadline, "deadline", cmd_id, name)
    issuer = body.get("issuer", "")
    if not isinstance(issuer, str) or len(issuer) > MAX_ISSUER_LEN:
        raise CommandInvalid(f"{name}: 'issuer' must be a string of at most {MAX_ISSUER_LEN} characters",
                             cmd_id=cmd_id, name=name)
    unknown = set(body) - BODY_KEYS
    if unknown:
        raise CommandInvalid(f"{name}: unknown body keys {sorted(map(str, unknown))}", cmd_id=cmd_id, name=name)
    try:
        params = validate_params(name, body.get("params"))
    except CommandInvalid as exc:
        raise CommandInvalid(exc.reason, cmd_id=cmd_id, name=name) from None
    return Command(cmd_id=cmd_id, name=name, issued_ns=issued_ns, deadline_ns=deadline_ns, params=params, issuer=issuer)


# ---------------------------------------------------------------------------
# results


def result_data(
    *,
    cmd_id: str,
    name: str,
    result: CmdResult | str,
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
        "result": CmdResult(result).value,  # a plain str on the wire
        "mav_result": mav_result,
        "detail": detail,
        "attempts": attempts,
        "latency_ms": round(max(0.0, latency_ms), 3),
    }
    data.update(extra)
    return data
