"""`VehicleSession`: one vehicle's MAVLink session, the implementation of `session.Session`.

It owns what is per vehicle: the link (`MavlinkLink`), the transfer lock (an
autopilot serves one mission/fence/rally or parameter transfer at a time) and
the protocol timeouts; every operation is a thin call into the runners
(`runner.py`), which drive the sans-IO protocol machines. No protocol
decision is made here. The Protocol, what the gateway may depend on, is
`session.py`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from mavjet.contract.errors import LinkError
from mavjet.drivers.mavlink import paramlist, runner, transfers
from mavjet.drivers.mavlink.autopilot import (
    arm_params,
    autopilot_version_fields,
    is_airborne,
    is_vehicle_heartbeat,
    set_mode_params,
)
from mavjet.drivers.mavlink.command import CommandOutcome, CommandResult
from mavjet.drivers.mavlink.dialect import MavMessage, mavlink2
from mavjet.drivers.mavlink.fence import Geofence
from mavjet.drivers.mavlink.link import LinkState, MavlinkLink
from mavjet.drivers.mavlink.logs import (
    DEFAULT_LOG_CONFIG,
    LogConfig,
    LogEntry,
    LogList,
    LogSink,
    LogWindow,
    request_end,
)
from mavjet.drivers.mavlink.mission import MISSION, MissionItem
from mavjet.drivers.mavlink.modes import Flavour, ModeTable, UnknownMode
from mavjet.drivers.mavlink.params import ParamTimeout, ParamUnknown, ParamValue, encoding_for
from mavjet.drivers.mavlink.runner import DEFAULT_CONFIG, OnProgress, ProtocolConfig
from mavjet.drivers.mavlink.session import FlightState, LinkHealth, Session
from mavjet.drivers.mavlink.terrain import (
    DEFAULT_TERRAIN_CHECK,
    Point,
    TerrainCheck,
    TerrainCheckConfig,
    TerrainReport,
)
from mavjet.drivers.mavlink.transfers import TransferReport

__all__ = ["VehicleSession"]

# A request/reply keeps a listener open for the reply; replies are rare, the buffer only has to ride out a burst.
_REPLY_BUFFER = 512
# A log window's burst (256 LOG_DATA) plus the telemetry interleaved with it.
_LOG_BUFFER = 4096


class VehicleSession:
    """The `Session` of one vehicle over a live `MavlinkLink` (see the module docstring)."""

    def __init__(
        self,
        link: MavlinkLink,
        *,
        protocols: ProtocolConfig = DEFAULT_CONFIG,
        flight_state: FlightState | None = None,
    ) -> None:
        self.link = link
        self._protocols = protocols
        self._flight_state = flight_state
        self._transfer_lock = anyio.Lock()
        self._log_downloads = 0  # running download_log calls (log_download_active)
        self._params = paramlist.ParamDirectory()  # ArduPilot's parameter names, fetched on a miss

    @property
    def transfer_lock(self) -> anyio.Lock:
        """The one-transfer-at-a-time lock; routing holds it while a ground station's transfer runs."""
        return self._transfer_lock

    # -- state ------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.link.name

    @property
    def endpoint(self) -> str:
        return str(self.link.endpoint)

    @property
    def state(self) -> LinkState:
        return self.link.state

    @property
    def is_up(self) -> bool:
        return self.link.is_up

    @property
    def target_system(self) -> int:
        return self.link.target_system

    @property
    def target_component(self) -> int:
        return self.link.target_component

    @property
    def source_system(self) -> int:
        return self.link.source_system

    @property
    def source_component(self) -> int:
        return self.link.source_component

    @property
    def connects(self) -> int:
        return self.link.stats.connects

    @property
    def last_heartbeat_mono(self) -> float:
        return self.link.last_heartbeat_mono

    @property
    def protocols(self) -> ProtocolConfig:
        return self._protocols

    @property
    def modes(self) -> ModeTable | None:
        return None if self._flight_state is None else self._flight_state.modes

    @property
    def flavour(self) -> Flavour | None:
        """The autopilot's flavour once its HEARTBEAT is known (mission read-back rules differ)."""
        modes = self.modes
        return None if modes is None else modes.flavour

    def is_airborne(self) -> bool:
        return self._flight_state is not None and is_airborne(self._flight_state.landed_state)

    def health(self) -> LinkHealth:
        link = self.link
        st = link.codec.stats
        hb = link.last_heartbeat_mono
        return LinkHealth(
            state=link.state,
            endpoint=str(link.endpoint),
            messages_in=st.messages_in,
            crc_errors=st.crc_errors,
            bad_data=st.bad_data,  # the framer counts an unknown id's frame as one bad stretch
            seq_gaps=st.seq_gaps,
            connects=link.stats.connects,
            heartbeat_age_s=time.monotonic() - hb if hb else None,
            by_type=st.by_type,  # live counts, not copied (read at scrape time)
        )

    # -- raw access -------------------------------------------------------
    async def send(self, msg: MavMessage) -> None:
        await self.link.send(msg)

    def listen(self, max_buffer: int = 0) -> AbstractAsyncContextManager[MemoryObjectReceiveStream[MavMessage]]:
        return self.link.listen(max_buffer)

    async def wait_ready(self) -> None:
        await self.link.wait_ready()

    async def wait_heartbeat(self, timeout_s: float | None = None) -> bool:
        """Wait (bounded: `timeout_s`, else `protocols.heartbeat_wait_s`) for the next autopilot HEARTBEAT.

        The link hands a batch to the telemetry model before any listener, so
        when this returns True the model has applied that HEARTBEAT.
        """
        link = self.link
        with anyio.move_on_after(self._protocols.heartbeat_wait_s if timeout_s is None else timeout_s):
            async with link.listen(64) as rx:
                async for msg in rx:
                    if is_vehicle_heartbeat(msg, link.target_system, link.target_component):
                        return True
        return False

    # -- commands ---------------------------------------------------------
    def _cfg(self, config: ProtocolConfig | None) -> ProtocolConfig:
        return self._protocols if config is None else config

    async def command(
        self,
        command: int,
        params: Sequence[float] = (),
        *,
        use_int: bool = False,
        frame: int | None = None,
        on_progress: OnProgress | None = None,
        config: ProtocolConfig | None = None,
    ) -> CommandOutcome:
        """Run one command to its end and return the outcome, whatever the MAV_RESULT (raises only LinkError)."""
        return await runner.execute_command(
            self.link, command, params, use_int=use_int, frame=frame, config=self._cfg(config), on_progress=on_progress
        )

    async def command_ok(
        self, command: int, params: Sequence[float] = (), *, config: ProtocolConfig | None = None
    ) -> CommandOutcome:
        """Run one command; raise CommandRejected / CommandTimeout unless ACCEPTED."""
        return await runner.run_command(self.link, command, params, config=self._cfg(config))

    async def request_reply(
        self,
        command: int,
        params: Sequence[float],
        reply: str,
        match: Callable[[MavMessage], bool] | None = None,
        *,
        wait_s: float,
        config: ProtocolConfig | None = None,
    ) -> MavMessage | None:
        """Send a command and return the first `reply` message accepted by `match`.

        None when the command is not accepted or no reply came within `wait_s`
        of the acceptance. The listener opens before the command is sent, so a
        reply that overtakes the COMMAND_ACK is not missed.
        """
        cfg = self._cfg(config)
        found: MavMessage | None = None
        with anyio.move_on_after(wait_s + cfg.command.ack_timeout_s * 3):
            async with self.link.listen(_REPLY_BUFFER) as rx, anyio.create_task_group() as tg:

                async def wait_reply() -> None:
                    nonlocal found
                    async for msg in rx:
                        if msg.get_type() == reply and (match is None or match(msg)):
                            found = msg
                            tg.cancel_scope.cancel()
                            return

                tg.start_soon(wait_reply)
                outcome = await runner.execute_command(self.link, command, params, config=cfg)
                if outcome.result is not CommandResult.ACCEPTED:
                    tg.cancel_scope.cancel()
                    return None
                await anyio.sleep(wait_s)
                tg.cancel_scope.cancel()
        return found

    async def set_mode(self, name: str, *, config: ProtocolConfig | None = None) -> CommandOutcome:
        """DO_SET_MODE by mode name; raises UnknownMode, CommandRejected, CommandTimeout."""
        modes = self.modes
        if modes is None:
            raise UnknownMode(name, [])
        return await self.command_ok(mavlink2.MAV_CMD_DO_SET_MODE, set_mode_params(modes, name), config=config)

    async def arm(self, *, config: ProtocolConfig | None = None) -> CommandOutcome:
        """Arm, never forced: a refusal by the pre-arm checks is the answer, not an obstacle."""
        return await self.command_ok(mavlink2.MAV_CMD_COMPONENT_ARM_DISARM, arm_params(True), config=config)

    async def disarm(self, *, force: bool = False, config: ProtocolConfig | None = None) -> CommandOutcome:
        return await self.command_ok(
            mavlink2.MAV_CMD_COMPONENT_ARM_DISARM, arm_params(False, force=force), config=config
        )

    # -- parameters -------------------------------------------------------
    def _param_cfg(self, config: ProtocolConfig | None) -> ProtocolConfig:
        """The protocol config with the autopilot's parameter encoding (PX4 bytewise, ArduPilot cast)."""
        cfg = self._cfg(config)
        encoding = encoding_for(self.flavour)
        if cfg.params.encoding is encoding:
            return cfg
        return dataclasses.replace(cfg, params=dataclasses.replace(cfg.params, encoding=encoding))

    async def read_param(self, name: str, *, config: ProtocolConfig | None = None) -> ParamValue:
        async with self._listed(name):
            pv = await runner.read_param(self.link, name, config=self._param_cfg(config))
        self._params.seen(pv.count)
        return pv

    async def set_param(
        self, name: str, value: float, *, param_type: int | None = None, config: ProtocolConfig | None = None
    ) -> ParamValue:
        async with self._listed(name):
            pv = await runner.set_param(self.link, name, value, param_type=param_type, config=self._param_cfg(config))
        self._params.seen(pv.count)
        return pv

    @contextlib.asynccontextmanager
    async def _listed(self, name: str) -> AsyncIterator[None]:
        """ArduPilot up to 4.7 does not answer an unknown name (PX4 and ArduPilot 4.8 send PARAM_ERROR, which the
        machines end on): a name its fresh parameter list lacks fails at once (ParamNotListed); a read that timed
        out fetches the list (once per connection, again when stale) and says so when the name is not in it."""
        if self.flavour is not Flavour.ARDUPILOT:
            yield
            return
        known = self._params.lacks(name, self.connects)
        if known is not None:
            raise known
        try:
            yield
        except ParamUnknown:
            raise
        except ParamTimeout:
            async with self._params.lock:
                if not self._params.fresh(self.connects):
                    connection = self.connects
                    listed = await paramlist.fetch_names(self.link, runner.target_system_of(self.link),
                                                         self.target_component)
                    if listed is not None:
                        self._params.store(*listed, connection)
            known = self._params.lacks(name, self.connects)
            if known is not None:
                raise known from None
            raise

    # -- missions (one transfer at a time: the session's lock) ----------------
    async def upload_mission(
        self, items: Sequence[MissionItem], mission_type: int = MISSION, *, config: ProtocolConfig | None = None
    ) -> TransferReport:
        return await transfers.upload_mission(
            self.link, items, mission_type, config=self._cfg(config), lock=self._transfer_lock, flavour=self.flavour
        )

    async def upload_and_verify(
        self, items: Sequence[MissionItem], mission_type: int = MISSION, *, config: ProtocolConfig | None = None
    ) -> str:
        return await transfers.upload_and_verify(
            self.link, items, mission_type, config=self._cfg(config), lock=self._transfer_lock, flavour=self.flavour
        )

    async def download_mission(
        self, mission_type: int = MISSION, *, config: ProtocolConfig | None = None
    ) -> list[MissionItem]:
        return await transfers.download_mission(self.link, mission_type, config=self._cfg(config), lock=self._transfer_lock,
                                                flavour=self.flavour)

    async def clear_mission(self, mission_type: int = MISSION, *, config: ProtocolConfig | None = None) -> None:
        await transfers.clear_mission(self.link, mission_type, config=self._cfg(config), lock=self._transfer_lock)

    async def apply_geofence(self, fence: Geofence, *, config: ProtocolConfig | None = None) -> str:
        return await transfers.apply_geofence(
            self.link, fence, config=self._cfg(config), lock=self._transfer_lock, flavour=self.flavour
        )

    # -- stream rates and identity ------------------------------------------
    async def set_message_rate(
        self, msg_id: int, hz: float, *, config: ProtocolConfig | None = None
    ) -> CommandOutcome:
        """SET_MESSAGE_INTERVAL in whole microseconds; raises CommandRejected / CommandTimeout."""
        return await self.command_ok(
            mavlink2.MAV_CMD_SET_MESSAGE_INTERVAL, (float(msg_id), float(round(1e6 / hz))), config=config
        )

    async def read_message_rate(
        self, msg_id: int, *, wait_s: float, config: ProtocolConfig | None = None
    ) -> float | None:
        """The message's current rate in Hz (0.0: disabled), or None when the autopilot does not say."""
        msg = await self.request_reply(
            mavlink2.MAV_CMD_GET_MESSAGE_INTERVAL, (float(msg_id),), "MESSAGE_INTERVAL",
            lambda m: int(m.message_id) == msg_id, wait_s=wait_s, config=config,
        )  # fmt: skip
        if msg is None:
            return None
        iv = int(msg.interval_us)
        return 1e6 / iv if iv > 0 else 0.0

    async def autopilot_version(
        self, *, wait_s: float, config: ProtocolConfig | None = None
    ) -> dict[str, Any] | None:
        """Firmware and board identity from AUTOPILOT_VERSION, or None when the autopilot does not answer."""
        msg = await self.request_reply(
            mavlink2.MAV_CMD_REQUEST_MESSAGE, (float(mavlink2.MAVLINK_MSG_ID_AUTOPILOT_VERSION),),
            "AUTOPILOT_VERSION", wait_s=wait_s, config=config,
        )  # fmt: skip
        return None if msg is None else autopilot_version_fields(msg)

    async def terrain_reports(
        self, points: Sequence[Point], *, config: TerrainCheckConfig = DEFAULT_TERRAIN_CHECK
    ) -> dict[Point, TerrainReport]:
        """The vehicle's TERRAIN_REPORT for each point (TERRAIN_CHECK, terrain.py); unanswered points are absent."""
        machine = TerrainCheck(points=list(points), target_system=runner.target_system_of(self.link), config=config)
        if points:
            async with self.link.listen(_REPLY_BUFFER) as rx:
                await runner.drive(self.link, machine, rx)
        return machine.reports

    # -- flight logs (the transfer lock is held per window, never for a whole log) --
    @property
    def log_download_active(self) -> bool:
        return self._log_downloads > 0

    async def list_logs(self, *, config: LogConfig = DEFAULT_LOG_CONFIG) -> list[LogEntry]:
        """Every log the autopilot holds (LOG_REQUEST_LIST); raises LogTimeout."""
        machine = LogList(target_system=runner.target_system_of(self.link),
                          target_component=self.target_component, config=config)
        async with self._transfer_lock, self.link.listen(_LOG_BUFFER) as rx:
            await runner.drive(self.link, machine, rx)
            await self.link.send(request_end(machine.target_system, machine.target_component))
        if machine.error is not None:
            raise machine.error
        return machine.result

    async def download_log(
        self, log_id: int, size_bytes: int, sink: LogSink, *, offset: int = 0, config: LogConfig = DEFAULT_LOG_CONFIG
    ) -> int:
        """Bytes [offset, size_bytes) of a log, in order, into `sink`; returns the offset reached.

        One window at a time under the transfer lock, released in between (a
        mission transfer waits one window at most; commands never wait for
        it). A window that times out raises LogTimeout whose `offset_bytes`
        is where a later call resumes; everything before it reached `sink`.
        """
        sysid, compid = runner.target_system_of(self.link), self.target_component
        probe = dataclasses.replace(config, max_attempts=1)
        self._log_downloads += 1
        try:
            while True:
                # Past `size_bytes`, one more window asks whether the file grew since it was listed: ArduPilot
                # closes the log being written at the first LOG_REQUEST_DATA and flushes what it buffered, so
                # the file can end up longer than its LOG_ENTRY (a short or empty LOG_DATA ends it at once).
                probing = offset >= size_bytes
                window = LogWindow(log_id=log_id, offset=offset,
                                   count=config.window_bytes if probing else min(config.window_bytes, size_bytes - offset),
                                   target_system=sysid, target_component=compid, config=probe if probing else config)
                async with self._transfer_lock, self.link.listen(_LOG_BUFFER) as rx:
                    await runner.drive(self.link, window, rx)
                data = window.contiguous()
                if data:
                    await sink(offset, data)  # may wait (a download paused while armed): outside the lock
                    offset += len(data)
                if probing and (not data or window.error is not None):
                    break  # nothing more (no answer to the probe is no more either)
                if window.error is not None:
                    raise window.error
                if window.eof_offset is not None and offset >= window.eof_offset:
                    break  # the file's end (shorter than its LOG_ENTRY said, or where it grew to)
        finally:
            self._log_downloads -= 1
            if self.link.is_up:
                with anyio.CancelScope(shield=True):
                    try:
                        await self.link.send(request_end(sysid, compid))
                    except LinkError:
                        pass  # the link went down meanwhile: nothing to end, and the real error is raised
        return offset


def _conforms(session: VehicleSession) -> Session:
    return session  # mypy checks here that VehicleSession implements the Protocol
