"""One vehicle's MAVLink session, shaped like MAVSDK's `System`.

`VehicleSession` owns what is per vehicle: the link (`MavlinkLink`), the
mission-transfer lock (an autopilot serves one transfer at a time) and the
protocol timeouts. It offers the vehicle's operations by name (command,
mission, parameters, stream rates, identity, `set_mode`, arm/disarm,
`is_airborne`) and the link's health as a public snapshot.

The gateway depends on the `Session` Protocol only, never on the link, so a
fake session fits the services in tests and nothing reaches into the link's
counters. Every operation is a thin call into the runners (`runner.py`), which
drive the sans-IO protocol machines; no protocol decision is made here.
`config=` on an operation overrides the session's timeouts for that call.

This module is the seam: the `Session` Protocol the gateway's services see,
and the snapshots it hands out. `vehiclesession.py` is the implementation.
Flight logs (`list_logs`, `download_log`) drive the machines of `logs.py`
window by window.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from anyio.streams.memory import MemoryObjectReceiveStream

from mavjet.drivers.mavlink.command import CommandOutcome
from mavjet.drivers.mavlink.dialect import MavMessage
from mavjet.drivers.mavlink.fence import Geofence
from mavjet.drivers.mavlink.link import LinkState
from mavjet.drivers.mavlink.logs import (
    DEFAULT_LOG_CONFIG,
    LogConfig,
    LogEntry,
    LogSink,
)
from mavjet.drivers.mavlink.mission import MISSION, MissionItem
from mavjet.drivers.mavlink.modes import ModeTable
from mavjet.drivers.mavlink.params import ParamValue
from mavjet.drivers.mavlink.runner import OnProgress, ProtocolConfig
from mavjet.drivers.mavlink.terrain import (
    DEFAULT_TERRAIN_CHECK,
    Point,
    TerrainCheckConfig,
    TerrainReport,
)
from mavjet.drivers.mavlink.transfers import TransferReport

__all__ = ["FlightState", "LinkHealth", "Session"]


class FlightState(Protocol):
    """What the session reads of the vehicle's live state (the gateway's telemetry model)."""

    @property
    def landed_state(self) -> int | None: ...

    @property
    def modes(self) -> ModeTable | None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkHealth:
    """The link's counters at one moment (for the link channel and metrics)."""

    state: LinkState
    endpoint: str
    messages_in: int
    crc_errors: int
    bad_data: int  # stretches of bytes that were not a valid frame (unknown message ids included); not bytes
    seq_gaps: int
    connects: int
    heartbeat_age_s: float | None  # None: no autopilot HEARTBEAT heard yet
    by_type: Mapping[str, int]  # messages by type: a live view, read it now or copy it


class Session(Protocol):
    """Everything the gateway may do with one vehicle over MAVLink."""

    @property
    def name(self) -> str: ...

    @property
    def endpoint(self) -> str: ...

    @property
    def state(self) -> LinkState: ...

    @property
    def is_up(self) -> bool: ...

    @property
    def target_system(self) -> int: ...

    @property
    def target_component(self) -> int: ...

    @property
    def connects(self) -> int:
        """How many times the transport (re)connected; a change means: re-read what you cached."""

    @property
    def last_heartbeat_mono(self) -> float:
        """time.monotonic() of the newest autopilot HEARTBEAT; 0.0 before the first."""

    @property
    def protocols(self) -> ProtocolConfig: ...

    @property
    def modes(self) -> ModeTable | None: ...

    def is_airborne(self) -> bool: ...

    def health(self) -> LinkHealth: ...

    # -- raw access -------------------------------------------------------
    async def send(self, msg: MavMessage) -> None: ...

    def listen(self, max_buffer: int = 0) -> AbstractAsyncContextManager[MemoryObjectReceiveStream[MavMessage]]: ...

    async def wait_ready(self) -> None: ...

    async def wait_heartbeat(self, timeout_s: float | None = None) -> bool: ...

    # -- commands ---------------------------------------------------------
    async def command(
        self,
        command: int,
        params: Sequence[float] = (),
        *,
        use_int: bool = False,
        frame: int | None = None,
        on_progress: OnProgress | None = None,
        config: ProtocolConfig | None = None,
    ) -> CommandOutcome: ...

    async def command_ok(
        self, command: int, params: Sequence[float] = (), *, config: ProtocolConfig | None = None
    ) -> CommandOutcome: ...

    async def request_reply(
        self,
        command: int,
        params: Sequence[float],
        reply: str,
        match: Callable[[MavMessage], bool] | None = None,
        *,
        wait_s: float,
        config: ProtocolConfig | None = None,
    ) -> MavMessage | None: ...

    async def set_mode(self, name: str, *, config: ProtocolConfig | None = None) -> CommandOutcome: ...

    async def arm(self, *, config: ProtocolConfig | None = None) -> CommandOutcome: ...

    async def disarm(self, *, force: bool = False, config: ProtocolConfig | None = None) -> CommandOutcome: ...

    # -- parameters -------------------------------------------------------
    async def read_param(self, name: str, *, config: ProtocolConfig | None = None) -> ParamValue: ...

    async def set_param(
        self, name: str, value: float, *, param_type: int | None = None, config: ProtocolConfig | None = None
    ) -> ParamValue: ...

    # -- missions ---------------------------------------------------------
    async def upload_mission(
        self, items: Sequence[MissionItem], mission_type: int = MISSION, *, config: ProtocolConfig | None = None
    ) -> TransferReport: ...

    async def upload_and_verify(
        self, items: Sequence[MissionItem], mission_type: int = MISSION, *, config: ProtocolConfig | None = None
    ) -> str: ...

    async def download_mission(
        self, mission_type: int = MISSION, *, config: ProtocolConfig | None = None
    ) -> list[MissionItem]: ...

    async def clear_mission(self, mission_type: int = MISSION, *, config: ProtocolConfig | None = None) -> None: ...

    async def apply_geofence(self, fence: Geofence, *, config: ProtocolConfig | None = None) -> str: ...

    # -- stream rates and identity ------------------------------------------
    async def set_message_rate(
        self, msg_id: int, hz: float, *, config: ProtocolConfig | None = None
    ) -> CommandOutcome: ...

    async def read_message_rate(
        self, msg_id: int, *, wait_s: float, config: ProtocolConfig | None = None
    ) -> float | None: ...

    async def autopilot_version(
        self, *, wait_s: float, config: ProtocolConfig | None = None
    ) -> dict[str, Any] | None: ...

    # -- flight logs --------------------------------------------------------
    async def list_logs(self, *, config: LogConfig = DEFAULT_LOG_CONFIG) -> list[LogEntry]: ...

    @property
    def log_download_active(self) -> bool:
        """A `download_log` is running: ArduPilot serves one log transfer at a time and ignores a list meanwhile."""
        ...

    async def terrain_reports(
        self, points: Sequence[Point], *, config: TerrainCheckConfig = DEFAULT_TERRAIN_CHECK
    ) -> dict[Point, TerrainReport]: ...

    async def download_log(
        self, log_id: int, size_bytes: int, sink: LogSink, *, offset: int = 0, config: LogConfig = DEFAULT_LOG_CONFIG
    ) -> int: ...
