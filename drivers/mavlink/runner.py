"""Async runners: drive the sans-IO protocol machines over a live `MavPort`.

All protocol decisions live in the machines (`command`, `mission`, `params`);
a runner only moves messages and time: it opens a listener *before* sending
(so a fast reply cannot be missed), feeds every received message and the
clock to the machine, sends what the machine returns, and wakes the machine
at its `next_deadline`. A backstop deadline from `ProtocolConfig` bounds
every operation; cancellation from the caller propagates untouched.

The one decision a runner makes is the arming state check: when an
ARM/DISARM ACK is missing, the command machine stops and asks for the armed
state, and the runner answers from the first autopilot HEARTBEAT that
arrives after the question (`heartbeat_wait_s`), before any retransmission.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from mavjet.contract.errors import (
    CommandRejected,
    CommandTimeout,
    ConfigError,
    LinkError,
)
from mavjet.drivers.mavlink.autopilot import heartbeat_armed, is_vehicle_heartbeat
from mavjet.drivers.mavlink.command import (
    CommandConfig,
    CommandOutcome,
    CommandProtocol,
    CommandRequest,
    CommandResult,
    CommandState,
)
from mavjet.drivers.mavlink.dialect import MavMessage
from mavjet.drivers.mavlink.mission import (
    MissionConfig,
)
from mavjet.drivers.mavlink.params import (
    REAL32,
    ParamConfig,
    ParamError,
    ParamTimeout,
    ParamValue,
    make_param_read,
    make_param_set,
)
from mavjet.drivers.mavlink.port import MavPort

OnProgress = Callable[[int | None], None]


@dataclass(frozen=True, kw_only=True, slots=True)
class ProtocolConfig:
    """Every timeout the protocol runners use (from the gateway's config)."""

    command: CommandConfig = field(default_factory=CommandConfig)
    mission: MissionConfig = field(default_factory=MissionConfig)
    params: ParamConfig = field(default_factory=ParamConfig)
    heartbeat_wait_s: float = 2.5  # arm/disarm state check: HEARTBEAT is 1 Hz
    operation_timeout_s: float = 120.0  # backstop for any one operation
    listen_buffer: int = 512

    def __post_init__(self) -> None:
        if not (0 < self.heartbeat_wait_s <= 60):
            raise ConfigError("protocols.heartbeat_wait_s", f"must be in (0, 60], got {self.heartbeat_wait_s}")
        if not (0 < self.operation_timeout_s <= 3600):
            raise ConfigError(
                "protocols.operation_timeout_s", f"must be in (0, 3600], got {self.operation_timeout_s}"
            )
        if not (16 <= self.listen_buffer <= 65536):
            raise ConfigError("protocols.listen_buffer", f"must be in [16, 65536], got {self.listen_buffer}")


DEFAULT_CONFIG = ProtocolConfig()


class _Machine(Protocol):
    @property
    def done(self) -> bool: ...

    @property
    def next_deadline(self) -> float | None: ...

    def start(self, now: float) -> list[MavMessage]: ...

    def on_message(self, msg: MavMessage, now: float) -> list[MavMessage]: ...

    def on_tick(self, now: float) -> list[MavMessage]: ...


def _endpoint(port: MavPort) -> str:
    return str(getattr(port, "endpoint", f"sys{port.target_system}"))


def target_system_of(port: MavPort) -> int:
    """The vehicle's system id; a link that has not seen a HEARTBEAT yet cannot address it."""
    sysid = port.target_system
    if not sysid:
        raise LinkError(_endpoint(port), "vehicle not identified yet (no HEARTBEAT received)")
    return sysid


async def _send_all(port: MavPort, msgs: Sequence[MavMessage]) -> None:
    for msg in msgs:
        await port.send(msg)


async def _receive_until(rx: MemoryObjectReceiveStream[MavMessage], port: MavPort, deadline: float | None) -> MavMessage:
    """Next message, or None once `deadline` (loop clock) passes. A closed listener is a LinkError."""
    timeout = None if deadline is None else max(0.0, deadline - anyio.current_time())
    try:
        if timeout is None:
            return await rx.receive()
        with anyio.move_on_after(timeout):
            return await rx.receive()
    except (anyio.EndOfStream, anyio.ClosedResourceError):
        raise LinkError(_endpoint(port), "listener closed while a protocol was running") from None
    return None


async def drive(port: MavPort, machine: _Machine, rx: MemoryObjectReceiveStream[MavMessage]) -> None:
    await _send_all(port, machine.start(anyio.current_time()))
    while not machine.done:
        msg = await _receive_until(rx, port, machine.next_deadline)
        now = anyio.current_time()
        out = machine.on_message(msg, now) if msg is not None else []
        deadline = machine.next_deadline
        if not machine.done and deadline is not None and now >= deadline:
            out = [*out, *machine.on_tick(now)]
        await _send_all(port, out)


# ---------------------------------------------------------------------------
# commands


async def execute_command(
    port: MavPort,
    command: int,
    params: Sequence[float] = (),
    *,
    use_int: bool = False,
    frame: int | None = None,
    config: ProtocolConfig = DEFAULT_CONFIG,
    on_progress: OnProgress | None = None,
) -> CommandOutcome:
    """Run one command to its end and return the outcome, whatever the MAV_RESULT.

    For callers that report every result (the gateway's command executor).
    `on_progress(percent or None)` is called for every IN_PROGRESS ack, so a
    caller can keep its own work alive (a JetStream in-progress ack) while a
    long action runs. Raises only LinkError (and cancellation).
    """
    padded = tuple(float(p) for p in params) + (0.0,) * (7 - len(params))
    if len(padded) != 7:
        raise ValueError(f"at most 7 params, got {len(params)}")
    kwargs: dict[str, Any] = {}
    if frame is not None:
        kwargs["frame"] = frame
    request = CommandRequest(
        command=command,
        params=padded,  # type: ignore[arg-type]  # length checked above
        use_int=use_int,
        target_system=target_system_of(port),
        target_component=port.target_component,
        **kwargs,
    )
    machine = CommandProtocol(
        request=request,
        config=config.command,
        source_system=int(getattr(port, "source_system", 0) or 0),
        source_component=int(getattr(port, "source_component", 0) or 0),
    )
    started = time.monotonic()
    try:
        with anyio.fail_after(config.operation_timeout_s):
            async with port.listen(config.listen_buffer) as rx:
                await _drive_command(port, machine, rx, config, on_progress)
    except TimeoutError:
        return CommandOutcome(
            command=command,
            result=CommandResult.TIMEOUT,
            mav_result=None,
            attempts=machine.attempts,
            latency_ms=(time.monotonic() - started) * 1000.0,
            progress=machine.progress,
        )
    assert machine.outcome is not None
    return machine.outcome


async def _drive_command(
    port: MavPort,
    machine: CommandProtocol,
    rx: MemoryObjectReceiveStream[MavMessage],
    config: ProtocolConfig,
    on_progress: OnProgress | None,
) -> None:
    await _send_all(port, machine.start(anyio.current_time()))
    check_deadline: float | None = None
    while not machine.done:
        checking = machine.state is CommandState.NEEDS_STATE_CHECK
        if checking and check_deadline is None:
            check_deadline = anyio.current_time() + config.heartbeat_wait_s
        deadline = check_deadline if checking else machine.next_deadline
        msg = await _receive_until(rx, port, deadline)
        now = anyio.current_time()
        out: list[MavMessage] = []
        if msg is not None:
            seen = machine.in_progress_acks
            out = machine.on_message(msg, now)  # a late ACK still settles it
            if on_progress is not None and machine.in_progress_acks != seen:
                on_progress(machine.progress)
            if checking and not machine.done and is_vehicle_heartbeat(msg, port.target_system, port.target_component):
                check_deadline = None
                out = [*out, *machine.resolve_state_check(heartbeat_armed(msg), now)]
        if checking and not machine.done and check_deadline is not None and now >= check_deadline:
            check_deadline = None
            out = [*out, *machine.resolve_state_check(None, now)]
        nd = machine.next_deadline
        if not machine.done and nd is not None and now >= nd:
            out = [*out, *machine.on_tick(now)]
        await _send_all(port, out)


async def run_command(
    port: MavPort,
    command: int,
    params: Sequence[float] = (),
    *,
    use_int: bool = False,
    frame: int | None = None,
    config: ProtocolConfig = DEFAULT_CONFIG,
) -> CommandOutcome:
    """Run a command; return the outcome when ACCEPTED.

    Raises CommandRejected(result=MAV_RESULT) for any other final result,
    CommandTimeout when no ACK arrived, LinkError when the link fails.
    """
    outcome = await execute_command(port, command, params, use_int=use_int, frame=frame, config=config)
    if outcome.result is CommandResult.ACCEPTED:
        return outcome
    if outcome.result is CommandResult.REJECTED:
        assert outcome.mav_result is not None
        raise CommandRejected(command, outcome.mav_result, outcome.mav_result_name)
    raise CommandTimeout(command, outcome.attempts)


# ---------------------------------------------------------------------------
# parameters


async def _run_param(port: MavPort, machine: Any, config: ProtocolConfig) -> ParamValue:
    try:
        with anyio.fail_after(config.operation_timeout_s):
            async with port.listen(config.listen_buffer) as rx:
                await drive(port, machine, rx)
    except TimeoutError:
        raise ParamTimeout(machine.name, machine.attempts) from None
    if machine.error is not None:
        err: ParamError = machine.error
        raise err
    result: ParamValue = machine.result
    return result


async def read_param(port: MavPort, name: str, *, config: ProtocolConfig = DEFAULT_CONFIG) -> ParamValue:
    """PARAM_REQUEST_READ by name; raises ParamTimeout when the vehicle never answers (unknown id)."""
    machine = make_param_read(name, target_system=target_system_of(port), target_component=port.target_component, config=config.params)
    return await _run_param(port, machine, config)


async def set_param(
    port: MavPort,
    name: str,
    value: float,
    *,
    param_type: int | None = None,
    config: ProtocolConfig = DEFAULT_CONFIG,
) -> ParamValue:
    """Set a parameter and return the value the vehicle confirmed.

    Without `param_type` the parameter is read first: that learns its type
    (integers are sent and compared as integers) and turns an unknown name
    into ParamTimeout before anything is written.
    """
    if param_type is None:
        param_type = (await read_param(port, name, config=config)).param_type
    machine = make_param_set(
        name,
        value,
        param_type if param_type else REAL32,
        target_system=target_system_of(port),
        target_component=port.target_component,
        config=config.params,
    )
    return await _run_param(port, machine, config)
