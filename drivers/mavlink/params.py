"""Sans-IO MAVLink parameter protocol: PARAM_SET / PARAM_REQUEST_READ → PARAM_VALUE.

Why a machine of its own: the parameter protocol has no ACK. A PARAM_SET is
confirmed only by a PARAM_VALUE with the same id carrying the new value, and
the autopilot also broadcasts PARAM_VALUE on its own, so the machine must
match by id, compare with float32 tolerance, and resend until the value holds
(https://mavlink.io/en/services/parameter.html).

Values travel as float32. ArduPilot casts integer values to float ("C cast"
encoding); PX4 copies their bytes into the float ("bytewise"). `ParamEncoding`
selects which. Param ids are at most 16 ASCII characters, null padded on the
wire (pymavlink strips the padding on receive).
"""

from __future__ import annotations

import enum
import math
import struct
from dataclasses import dataclass

from mavjet.contract.errors import ConfigError, MavjetError
from mavjet.drivers.mavlink.dialect import MavMessage, mavlink2

PARAM_ID_MAX_LEN = 16

INT_TYPES: dict[int, str] = {
    mavlink2.MAV_PARAM_TYPE_UINT8: "<B",
    mavlink2.MAV_PARAM_TYPE_INT8: "<b",
    mavlink2.MAV_PARAM_TYPE_UINT16: "<H",
    mavlink2.MAV_PARAM_TYPE_INT16: "<h",
    mavlink2.MAV_PARAM_TYPE_UINT32: "<I",
    mavlink2.MAV_PARAM_TYPE_INT32: "<i",
}
REAL32 = mavlink2.MAV_PARAM_TYPE_REAL32


class ParamEncoding(enum.Enum):
    CAST = "cast"  # ArduPilot
    BYTEWISE = "bytewise"  # PX4


class ParamError(MavjetError):
    """A parameter operation failed; `name` is the param id."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"param {name}: {reason}")
        self.name = name
        self.reason = reason


class ParamTimeout(ParamError):
    """No PARAM_VALUE for `name` after every attempt (unknown param, or link down)."""

    def __init__(self, name: str, attempts: int) -> None:
        super().__init__(name, f"no PARAM_VALUE after {attempts} attempts")
        self.attempts = attempts


class ParamUnknown(ParamTimeout):
    """The vehicle said it has no parameter `name` (PARAM_ERROR DOES_NOT_EXIST: PX4, ArduPilot 4.8), or sent
    another PARAM_ERROR (`error` names it): final at once, nothing is resent.

    A ParamTimeout's definite form: what took a silent vehicle's timeout for "unknown parameter" (the shadow)
    keeps doing so, at once; what can tell them apart (commands) says which.
    """

    def __init__(self, name: str, error: int, attempts: int = 1) -> None:
        what = _PARAM_ERRORS.get(error, f"error {error}")
        reason = ("the vehicle has no such parameter" if error == PARAM_ERROR_DOES_NOT_EXIST
                  else f"the vehicle refused it: {what}")
        ParamError.__init__(self, name, f"{reason} (PARAM_ERROR {what})")
        self.attempts = attempts
        self.error = error


PARAM_ERROR_DOES_NOT_EXIST = 1
# MAV_PARAM_ERROR (common.xml; the dialect's copy stops at 5, PX4 sends up to 8).
_PARAM_ERRORS: dict[int, str] = {
    0: "NO_ERROR", 1: "DOES_NOT_EXIST", 2: "VALUE_OUT_OF_RANGE", 3: "PERMISSION_DENIED", 4: "COMPONENT_NOT_FOUND",
    5: "READ_ONLY", 6: "TYPE_UNSUPPORTED", 7: "TYPE_MISMATCH", 8: "READ_FAIL",
}


class ParamMismatch(ParamError):
    """The vehicle kept reporting a value other than the one set (rejected or clamped)."""

    def __init__(self, name: str, wanted: float, reported: float, attempts: int) -> None:
        super().__init__(name, f"set to {wanted} but the vehicle reports {reported} after {attempts} attempts")
        self.wanted = wanted
        self.reported = reported
        self.attempts = attempts


def encode_param_id(name: str) -> bytes:
    """The wire form of a param id; raises ParamError for ids MAVLink cannot carry."""
    if not name:
        raise ParamError(name, "empty param id")
    try:
        raw = name.encode("ascii")
    except UnicodeEncodeError:
        raise ParamError(name, "param ids are ASCII") from None
    if len(raw) > PARAM_ID_MAX_LEN:
        raise ParamError(name, f"longer than {PARAM_ID_MAX_LEN} characters")
    if b"\x00" in raw:
        raise ParamError(name, "contains a NUL byte")
    return raw


def decode_param_id(raw: str | bytes) -> str:
    """Param id of a received message, without its null padding."""
    if isinstance(raw, bytes):
        raw = raw.decode("ascii", errors="replace")
    return raw.split("\x00", 1)[0]


def to_float32(value: float) -> float:
    """`value` rounded to what a MAVLink float field carries."""
    if math.isnan(value) or math.isinf(value):
        return value
    try:
        return float(struct.unpack("<f", struct.pack("<f", value))[0])
    except OverflowError:
        return math.copysign(math.inf, value)


def encoding_for(flavour: str | None) -> ParamEncoding:
    """The autopilot's parameter encoding: PX4 bytewise, ArduPilot (and anything else) C cast.

    PX4 announces MAV_PROTOCOL_CAPABILITY_PARAM_ENCODE_BYTEWISE and copies an
    INT32's bytes into param_value (mavlink_parameters.cpp); ArduPilot casts.
    """
    return ParamEncoding.BYTEWISE if flavour == "px4" else ParamEncoding.CAST


def encode_param_value(value: float, param_type: int, encoding: ParamEncoding = ParamEncoding.CAST) -> float:
    """The float32 to put in PARAM_SET.param_value."""
    if param_type in INT_TYPES:
        if not float(value).is_integer():
            raise ParamError("?", f"value {value} is not an integer for param type {param_type}")
        ivalue = int(value)
        fmt = INT_TYPES[param_type]
        try:
            packed = struct.pack(fmt, ivalue)
        except struct.error:
            raise ParamError("?", f"value {ivalue} out of range for param type {param_type}") from None
        if encoding is ParamEncoding.BYTEWISE:
            return float(struct.unpack("<f", packed.ljust(4, b"\x00"))[0])
        return float(ivalue)
    return to_float32(float(value))


def decode_param_value(wire: float, param_type: int, encoding: ParamEncoding = ParamEncoding.CAST) -> float:
    """The parameter's value from PARAM_VALUE.param_value (ints come back as integral floats)."""
    if param_type in INT_TYPES:
        if encoding is ParamEncoding.BYTEWISE:
            raw = struct.pack("<f", wire)
            fmt = INT_TYPES[param_type]
            size = struct.calcsize(fmt)
            return float(struct.unpack(fmt, raw[:size])[0])
        return float(round(wire))
    return float(wire)


def values_equal(wanted: float, reported: float, param_type: int, *, rel_tol: float = 1e-6, abs_tol: float = 1e-6) -> bool:
    """Equal as the vehicle stores them: exact for ints, float32 tolerance for reals."""
    if param_type in INT_TYPES:
        return round(wanted) == round(reported)
    a, b = to_float32(wanted), to_float32(reported)
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=rel_tol, abs_tol=abs_tol)


@dataclass(frozen=True, kw_only=True, slots=True)
class ParamConfig:
    """Timeouts and retry bounds of the parameter protocol."""

    timeout_s: float = 1.0
    max_attempts: int = 4
    encoding: ParamEncoding = ParamEncoding.CAST
    rel_tol: float = 1e-6

    def __post_init__(self) -> None:
        if not (0 < self.timeout_s <= 60):
            raise ConfigError("params.timeout_s", f"must be in (0, 60], got {self.timeout_s}")
        if not (1 <= self.max_attempts <= 20):
            raise ConfigError("params.max_attempts", f"must be in [1, 20], got {self.max_attempts}")
        if not (0 <= self.rel_tol < 0.1):
            raise ConfigError("params.rel_tol", f"must be in [0, 0.1), got {self.rel_tol}")


@dataclass(frozen=True, kw_only=True, slots=True)
class ParamValue:
    """A parameter as the vehicle reported it."""

    name: str
    value: float
    param_type: int
    index: int
    count: int


def _param_value(msg: MavMessage, encoding: ParamEncoding) -> ParamValue:
    ptype = int(msg.param_type)
    return ParamValue(
        name=decode_param_id(msg.param_id),
        value=decode_param_value(float(msg.param_value), ptype, encoding),
        param_type=ptype,
        index=int(msg.param_index),
        count=int(msg.param_count),
    )


@dataclass(slots=True)
class _ParamMachine:
    """Shared resend-until-PARAM_VALUE skeleton."""

    name: str
    target_system: int
    target_component: int
    config: ParamConfig
    attempts: int = 0
    next_deadline: float | None = None
    result: ParamValue | None = None
    error: ParamError | None = None
    _wire_id: bytes = b""

    def __post_init__(self) -> None:
        self._wire_id = encode_param_id(self.name)

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None

    def _build(self) -> MavMessage:
        raise NotImplementedError

    def _send(self, now: float) -> list[MavMessage]:
        self.attempts += 1
        self.next_deadline = now + self.config.timeout_s
        return [self._build()]

    def start(self, now: float) -> list[MavMessage]:
        if self.attempts:
            raise RuntimeError("param machine started twice")
        return self._send(now)

    def _answers(self, msg: MavMessage) -> bool:
        return (
            msg.get_type() == "PARAM_VALUE"
            and msg.get_srcSystem() == self.target_system
            and decode_param_id(msg.param_id) == self.name
        )

    def _give_up(self) -> ParamError:
        return ParamTimeout(self.name, self.attempts)

    def _refused(self, msg: MavMessage) -> bool:
        """A PARAM_ERROR about this name from the vehicle (PX4 answers an unknown name so): the machine ends."""
        if (msg.get_type() != "PARAM_ERROR" or msg.get_srcSystem() != self.target_system
                or decode_param_id(msg.param_id) != self.name):
            return False
        self.error = ParamUnknown(self.name, int(msg.error), self.attempts)
        self.next_deadline = None
        return True

    def on_tick(self, now: float) -> list[MavMessage]:
        if self.done or self.next_deadline is None or now < self.next_deadline:
            return []
        if self.attempts >= self.config.max_attempts:
            self.error = self._give_up()
            self.next_deadline = None
            return []
        return self._send(now)


@dataclass(slots=True)
class ParamRead(_ParamMachine):
    """PARAM_REQUEST_READ by name, resent until PARAM_VALUE with that id arrives."""

    def _build(self) -> MavMessage:
        return mavlink2.MAVLink_param_request_read_message(
            self.target_system, self.target_component, self._wire_id, -1
        )

    def on_message(self, msg: MavMessage, now: float) -> list[MavMessage]:
        if self.done or self._refused(msg) or not self._answers(msg):
            return []
        self.result = _param_value(msg, self.config.encoding)
        self.next_deadline = None
        return []


@dataclass(slots=True)
class ParamSet(_ParamMachine):
    """PARAM_SET, resent until a PARAM_VALUE with the same id reports the value.

    A PARAM_VALUE with another value may be a broadcast that crossed our set
    in flight, so it is not final: the set is resent (an attempt) and only
    after `max_attempts` does the machine give up with ParamMismatch.
    """

    value: float = 0.0
    param_type: int = REAL32
    last_reported: ParamValue | None = None

    def _build(self) -> MavMessage:
        wire = encode_param_value(self.value, self.param_type, self.config.encoding)
        return mavlink2.MAVLink_param_set_message(
            self.target_system, self.target_component, self._wire_id, wire, self.param_type
        )

    def __post_init__(self) -> None:
        _ParamMachine.__post_init__(self)
        try:
            encode_param_value(self.value, self.param_type, self.config.encoding)
        except ParamError as exc:
            raise ParamError(self.name, exc.reason) from None

    def _give_up(self) -> ParamError:
        if self.last_reported is not None:
            return ParamMismatch(self.name, self.value, self.last_reported.value, self.attempts)
        return ParamTimeout(self.name, self.attempts)

    def on_message(self, msg: MavMessage, now: float) -> list[MavMessage]:
        if self.done or self._refused(msg) or not self._answers(msg):
            return []
        reported = _param_value(msg, self.config.encoding)
        self.last_reported = reported
        if values_equal(self.value, reported.value, reported.param_type, rel_tol=self.config.rel_tol):
            self.result = reported
            self.next_deadline = None
            return []
        # Wrong value: retry now rather than at the timeout (bounded by attempts).
        if self.attempts >= self.config.max_attempts:
            self.error = self._give_up()
            self.next_deadline = None
            return []
        return self._send(now)


def make_param_set(
    name: str,
    value: float,
    param_type: int,
    *,
    target_system: int,
    target_component: int,
    config: ParamConfig | None = None,
) -> ParamSet:
    return ParamSet(
        name=name,
        target_system=target_system,
        target_component=target_component,
        config=config or ParamConfig(),
        value=value,
        param_type=param_type,
    )


def make_param_read(
    name: str, *, target_system: int, target_component: int, config: ParamConfig | None = None
) -> ParamRead:
    return ParamRead(
        name=name, target_system=target_system, target_component=target_component, config=config or ParamConfig()
    )

