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
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from drivers.mavlink.autopilot import is_vehicle_heartbeat
from drivers.mavlink.command import (
    CommandConfig,
    CommandOutcome,
    CommandProtocol,
    CommandRequest,
    CommandResult,
    CommandState,
    heartbeat_armed,
)
from drivers.mavlink.dialect import MavMessage
from drivers.mavlink.fence import Geofence
from drivers.mavlink.mission import (
    FENCE,
    MISSION,
    MissionClear,
    MissionConfig,
    MissionDownload,
    MissionItem,
    MissionRejected,
    MissionTimeout,
    MissionUpload,
    item_label,
    mission_type_name,
)
from drivers.mavlink.modes import Flavour
from drivers.mavlink.normalise import check_item, differences
from drivers.mavlink.params import (
    REAL32,
    ParamConfig,
    ParamError,
    ParamTimeout,
    ParamValue,
    make_param_read,
    make_param_set,
)
from drivers.mavlink.plan import digest
from drivers.mavlink.port import MavPort
from gateway.contract.errors import (
    CommandRejected,
    CommandTimeout,
    ConfigError,
    LinkError,
    ProtocolError,
)

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


def _target(port: MavPort) -> int:
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


async def _drive(port: MavPort, machine: _Machine, rx: MemoryObjectReceiveStream[MavMessage]) -> None:
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
        target_system=_target(port),
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
# missions


@dataclass(frozen=True, kw_only=True, slots=True)
class TransferReport:
    """How a mission transfer went (for logs and metrics)."""

    mission_type: int
    count: int
    resends: int
    ignored: int
    elapsed_ms: float


@asynccontextmanager
async def _held(lock: anyio.Lock | None) -> AsyncIterator[None]:
    """Hold the vehicle's transfer lock, when the caller owns one.

    An autopilot serves one mission transfer at a time and a second one resets
    the first, so a vehicle's transfers must be serialised. The lock belongs to
    whoever owns the vehicle (drivers.mavlink.session.VehicleSession), not to
    this module: the runners stay free of global state.
    """
    if lock is None:
        yield
    else:
        async with lock:
            yield


async def _run_transfer(
    port: MavPort, machine: MissionUpload | MissionDownload | MissionClear, config: ProtocolConfig
) -> float:
    started = time.monotonic()
    try:
        with anyio.fail_after(config.operation_timeout_s):
            async with port.listen(config.listen_buffer) as rx:
                await _drive(port, machine, rx)
    except TimeoutError:
        raise MissionTimeout(machine.PROTOCOL, "the operation deadline", machine.retries) from None
    if machine.error is not None:
        raise machine.error
    return (time.monotonic() - started) * 1000.0


async def _upload(
    port: MavPort, items: Sequence[MissionItem], mission_type: int, config: ProtocolConfig
) -> TransferReport:
    machine = MissionUpload(
        target_system=_target(port),
        target_component=port.target_component,
        mission_type=mission_type,
        config=config.mission,
        items=tuple(items),
    )
    elapsed = await _run_transfer(port, machine, config)
    return TransferReport(
        mission_type=mission_type, count=len(items), resends=machine.resends, ignored=machine.ignored, elapsed_ms=elapsed
    )


async def _download(port: MavPort, mission_type: int, config: ProtocolConfig) -> list[MissionItem]:
    machine = MissionDownload(
        target_system=_target(port),
        target_component=port.target_component,
        mission_type=mission_type,
        config=config.mission,
    )
    await _run_transfer(port, machine, config)
    return list(machine.items)


async def upload_mission(
    port: MavPort,
    items: Sequence[MissionItem],
    mission_type: int = MISSION,
    *,
    config: ProtocolConfig = DEFAULT_CONFIG,
    lock: anyio.Lock | None = None,
) -> TransferReport:
    """Upload `items` (seq 0..n-1) as `mission_type`; raises MissionRejected, MissionTimeout, ProtocolError."""
    async with _held(lock):
        return await _upload(port, items, mission_type, config)


async def download_mission(
    port: MavPort, mission_type: int = MISSION, *, config: ProtocolConfig = DEFAULT_CONFIG, lock: anyio.Lock | None = None
) -> list[MissionItem]:
    """Read the vehicle's `mission_type` items back."""
    async with _held(lock):
        return await _download(port, mission_type, config)


async def clear_mission(
    port: MavPort, mission_type: int = MISSION, *, config: ProtocolConfig = DEFAULT_CONFIG, lock: anyio.Lock | None = None
) -> None:
    async with _held(lock):
        machine = MissionClear(
            target_system=_target(port),
            target_component=port.target_component,
            mission_type=mission_type,
            config=config.mission,
        )
        await _run_transfer(port, machine, config)


class MissionMismatch(ProtocolError):
    """The mission read back differs from the one uploaded (after read-back normalisation).

    `seq` and `detail` name the first item that differs and how, when the
    counts agree.
    """

    def __init__(
        self, mission_type: int, uploaded: str, downloaded: str, *, seq: int | None = None, detail: str = ""
    ) -> None:
        where = f" ({item_label(mission_type, seq)}: {detail})" if seq is not None else (f" ({detail})" if detail else "")
        super().__init__(
            "mission_verify",
            f"{mission_type_name(mission_type)} read back with digest {downloaded[:12]}, uploaded {uploaded[:12]}{where}",
        )
        self.mission_type = mission_type
        self.uploaded = uploaded
        self.downloaded = downloaded
        self.seq = seq
        self.detail = detail


def check_upload(items: Sequence[MissionItem], flavour: Flavour | str | None) -> None:
    """Raise MissionRejected, naming the item, for the first item the vehicle would refuse.

    Checked before anything is sent: ArduPilot truncates its stored mission
    to the new count at MISSION_COUNT and does not roll back a refused upload.
    """
    for item in items:
        problem = check_item(item, flavour or Flavour.GENERIC)
        if problem is not None:
            raise MissionRejected(
                "mission_upload", problem.result, item.mission_type, seq=problem.seq, why=problem.reason
            )


def compare_readback(
    sent: Sequence[MissionItem], back: Sequence[MissionItem], mission_type: int, flavour: Flavour | str | None
) -> None:
    """Raise MissionMismatch unless `back` is how an autopilot of `flavour` reads `sent` back.

    Both sides are normalised (`normalise.readback`); seq 0 of a MISSION is
    the vehicle's own home and is not compared. Without a known flavour the
    items are compared in the digest's form (the coarsest).
    """
    want, got = digest(sent), digest(back)
    if len(sent) != len(back):
        raise MissionMismatch(mission_type, want, got, detail=f"{len(back)} items read back, {len(sent)} sent")
    for a, b in zip(sent, back, strict=True):
        if mission_type == MISSION and a.seq == 0:
            continue
        diff = differences(a, b, flavour or Flavour.ARDUPILOT)
        if diff:
            raise MissionMismatch(mission_type, want, got, seq=a.seq, detail="; ".join(diff))


async def upload_and_verify(
    port: MavPort,
    items: Sequence[MissionItem],
    mission_type: int = MISSION,
    *,
    config: ProtocolConfig = DEFAULT_CONFIG,
    lock: anyio.Lock | None = None,
    flavour: Flavour | str | None = None,
) -> str:
    """Check, upload, download, compare normalised items; return the digest or raise.

    Raises MissionRejected (naming the item) when an item would be refused or
    the vehicle refuses one, MissionMismatch when the read-back differs.
    A missing final MISSION_ACK (lost on a lossy link) does not fail the
    upload here: the download decides whether the vehicle holds the mission.
    """
    items = [it if it.mission_type == mission_type else replace(it, mission_type=mission_type) for it in items]
    check_upload(items, flavour)
    async with _held(lock):
        try:
            await _upload(port, items, mission_type, config)
        except MissionTimeout as exc:
            if exc.stage != "MISSION_ACK":
                raise
        back = await _download(port, mission_type, config)
    compare_readback(items, back, mission_type, flavour)
    return digest(back)


# ---------------------------------------------------------------------------
# parameters


async def _run_param(port: MavPort, machine: Any, config: ProtocolConfig) -> ParamValue:
    try:
        with anyio.fail_after(config.operation_timeout_s):
            async with port.listen(config.listen_buffer) as rx:
                await _drive(port, machine, rx)
    except TimeoutError:
        raise ParamTimeout(machine.name, machine.attempts) from None
    if machine.error is not None:
        err: ParamError = machine.error
        raise err
    result: ParamValue = machine.result
    return result


async def read_param(port: MavPort, name: str, *, config: ProtocolConfig = DEFAULT_CONFIG) -> ParamValue:
    """PARAM_REQUEST_READ by name; raises ParamTimeout when the vehicle never answers (unknown id)."""
    machine = make_param_read(name, target_system=_target(port), target_component=port.target_component, config=config.params)
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
        target_system=_target(port),
        target_component=port.target_component,
        config=config.params,
    )
    return await _run_param(port, machine, config)


# ---------------------------------------------------------------------------
# geofence


async def apply_geofence(
    port: MavPort,
    fence: Geofence,
    *,
    config: ProtocolConfig = DEFAULT_CONFIG,
    lock: anyio.Lock | None = None,
    flavour: Flavour | str | None = None,
) -> str:
    """Upload and verify the FENCE zones, then set and confirm the fence parameters.

    Zones go first and the FENCE_ENABLE switch last, so a vehicle never
    enforces a half-written fence. Returns the zones' digest.
    """
    items = fence.items()
    fence_digest = await upload_and_verify(port, items, FENCE, config=config, lock=lock, flavour=flavour)
    params = fence.params()
    enable = params.pop("FENCE_ENABLE")
    for name, value in params.items():
        await set_param(port, name, value, config=config)
    await set_param(port, "FENCE_ENABLE", enable, config=config)
    return fence_digest
