"""A live MAVLink link to one vehicle: the real `MavPort`.

It owns the transport (reconnecting with capped, jittered backoff), the codec,
the gateway's 1 Hz HEARTBEAT as an onboard controller, the stream requests
(SET_MESSAGE_INTERVAL, with REQUEST_DATA_STREAM as the fallback ArduPilot SITL
needs), and link-loss detection by heartbeat timeout. Decoded messages go to
one synchronous callback in batches (the hot path) and to any bounded
listeners (protocol runners). The gateway does not use a link directly: it
talks to the vehicle's `drivers.mavlink.session.Session`, which owns the link.

Routing (gateway/routes.py) taps the whole frames received, as bytes
(`tap_frames`), and injects frames as they are (`send_raw`): the `FrameTap`
seam. The module is a little over 400 lines because the link's reconnect,
keep-alive, stream and tap duties share its transport and state.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

import anyio
import structlog
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from drivers.mavlink.autopilot import is_autopilot_heartbeat
from drivers.mavlink.backoff import Backoff
from drivers.mavlink.codec import GATEWAY_COMPONENT_ID, GATEWAY_SYSTEM_ID, ConstantMessage, MavCodec
from drivers.mavlink.dialect import MavMessage, mavlink2
from drivers.mavlink.router import FrameSplitter
from drivers.mavlink.signing import MavSigning
from drivers.mavlink.transport import Endpoint, Transport, open_transport
from gateway.contract.errors import ConfigError, LinkError

log = structlog.get_logger("mavjet.link")

# Messages the gateway needs and the rate it asks for (Hz). Position and
# attitude are asked at the state rate; the rest at 1-2 Hz.
DEFAULT_STREAMS_HZ: dict[str, float] = {
    "GLOBAL_POSITION_INT": 10.0,
    "ATTITUDE": 10.0,
    "VFR_HUD": 2.0,
    "SYS_STATUS": 1.0,
    "GPS_RAW_INT": 1.0,
    "BATTERY_STATUS": 1.0,
    "EXTENDED_SYS_STATE": 1.0,
    "SYSTEM_TIME": 1.0,
    "HOME_POSITION": 0.2,
}

# A stream is asked for again after this many of its intervals without a sample (and stream_stale_s).
STALE_INTERVALS = 2.5
# What the gateway says it is, once a second on every link: an onboard controller, active.
GATEWAY_HEARTBEAT = ConstantMessage(mavlink2.MAVLink_heartbeat_message(
    mavlink2.MAV_TYPE_ONBOARD_CONTROLLER, mavlink2.MAV_AUTOPILOT_INVALID, 0, 0, mavlink2.MAV_STATE_ACTIVE, 3))

# REQUEST_DATA_STREAM groups covering the messages above (ArduPilot's mapping).
_DATA_STREAMS = (
    (mavlink2.MAV_DATA_STREAM_POSITION, "GLOBAL_POSITION_INT"),
    (mavlink2.MAV_DATA_STREAM_EXTRA1, "ATTITUDE"),
    (mavlink2.MAV_DATA_STREAM_EXTRA2, "VFR_HUD"),
    (mavlink2.MAV_DATA_STREAM_EXTENDED_STATUS, "SYS_STATUS"),
    (mavlink2.MAV_DATA_STREAM_EXTRA3, "BATTERY_STATUS"),
)


class LinkState(StrEnum):
    CONNECTING = "connecting"
    UP = "up"  # heartbeats arriving
    LOST = "lost"  # transport open, heartbeats stopped
    DOWN = "down"  # transport closed, reconnecting


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkConfig:
    heartbeat_timeout_s: float = 3.0
    heartbeat_interval_s: float = 1.0
    connect_timeout_s: float = 5.0
    backoff_initial_s: float = 0.25
    backoff_max_s: float = 10.0
    stream_check_interval_s: float = 2.0
    stream_stale_s: float = 5.0
    streams_hz: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_STREAMS_HZ))
    listener_buffer: int = 256

    def __post_init__(self) -> None:
        for key in ("heartbeat_timeout_s", "heartbeat_interval_s", "connect_timeout_s", "backoff_initial_s"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"link.{key}", "must be > 0")
        if self.backoff_max_s < self.backoff_initial_s:
            raise ConfigError("link.backoff_max_s", "must be >= backoff_initial_s")
        if self.heartbeat_timeout_s <= self.heartbeat_interval_s:
            raise ConfigError("link.heartbeat_timeout_s", "must exceed the heartbeat interval")
        for name, hz in self.streams_hz.items():
            if not hasattr(mavlink2, f"MAVLINK_MSG_ID_{name}"):
                raise ConfigError(f"link.streams_hz.{name}", "unknown MAVLink message")
            if not 0 < hz <= 50:
                raise ConfigError(f"link.streams_hz.{name}", "rate must be in (0, 50] Hz")


@dataclass(slots=True)
class LinkCounters:
    connects: int = 0
    disconnects: int = 0
    listener_drops: int = 0
    stream_requests: int = 0
    send_errors: int = 0


OnMessages = Callable[[list[MavMessage], int], None]
OnState = Callable[[LinkState, LinkState], None]
# Whole frames received from the vehicle, as bytes, untouched (routes, the NATS tunnel).
OnFrames = Callable[[list[bytes]], None]


class FrameTap(Protocol):
    """Raw frames both ways: what routing needs of a link, and nothing else."""

    @property
    def target_system(self) -> int: ...

    @property
    def target_component(self) -> int: ...

    def tap_frames(self, handler: OnFrames) -> Callable[[], None]:
        """Call `handler(frames)` with every whole frame from the vehicle; returns the unsubscribe function."""

    async def send_raw(self, data: bytes) -> None:
        """Send whole frames to the vehicle as they are; raises LinkError when the link is down."""


class MavlinkLink:
    """One vehicle's link. Run `run()` in a task group; use `send`/`listen` from others."""

    def __init__(
        self,
        *,
        name: str,
        endpoint: Endpoint,
        config: LinkConfig,
        on_messages: OnMessages,
        on_state: OnState | None = None,
        src_system: int = GATEWAY_SYSTEM_ID,
        transport_factory: Callable[[], Awaitable[Transport]] | None = None,
        expected_sysid: int | None = None,
        signing_key: bytes | None = None,
    ) -> None:
        self.name = name
        self.endpoint = endpoint
        self.config = config
        # With a key every frame sent is signed and every frame received must be
        # (drivers/mavlink/signing.py); the state outlives reconnects, so a frame
        # replayed after one is still refused.
        signing = MavSigning(signing_key) if signing_key is not None else None
        self.codec = MavCodec(src_system=src_system, src_component=GATEWAY_COMPONENT_ID, signing=signing)
        # A shared port (drivers/mavlink/udphub.py) supplies its own transport,
        # and the vehicle's system id is known in advance.
        self.transport_factory = transport_factory
        self.stats = LinkCounters()
        self.state = LinkState.CONNECTING
        self._on_messages = on_messages
        self._on_state = on_state
        self._transport: Transport | None = None
        self._listeners: set[MemoryObjectSendStream[MavMessage]] = set()
        self._target_system = expected_sysid or 0
        self._target_component = 1
        self.last_heartbeat_mono = 0.0
        self._last_seen_mono: dict[str, float] = {}
        self._interval_supported: bool | None = None
        self._ready = anyio.Event()
        # Raw-frame taps: only when something taps the link does it split frames a second time.
        self._taps: list[OnFrames] = []
        self._splitter = FrameSplitter()

    # -- raw frames (FrameTap) -------------------------------------------
    def tap_frames(self, handler: OnFrames) -> Callable[[], None]:
        self._taps.append(handler)

        def untap() -> None:
            if handler in self._taps:
                self._taps.remove(handler)

        return untap

    async def send_raw(self, data: bytes) -> None:
        t = self._transport
        if t is None or self.state is LinkState.DOWN:
            raise LinkError(str(self.endpoint), "link is down")
        try:
            await t.send(data)
        except LinkError:
            self.stats.send_errors += 1
            raise

    def _tap(self, data: bytes) -> None:
        frames = self._splitter.feed(data)
        if frames:
            for handler in list(self._taps):
                try:
                    handler(frames)
                except Exception:  # a route's bug must not stop the vehicle's telemetry
                    log.exception("frame_tap_failed", vehicle=self.name)

    # -- MavPort ---------------------------------------------------------
    @property
    def target_system(self) -> int:
        return self._target_system

    @property
    def target_component(self) -> int:
        return self._target_component

    @property
    def source_system(self) -> int:
        """Our own system id: ACKs addressed to another ground station are not ours."""
        return self.codec.src_system

    @property
    def source_component(self) -> int:
        return self.codec.src_component

    @property
    def is_up(self) -> bool:
        return self.state is LinkState.UP

    async def send(self, msg: MavMessage) -> None:
        t = self._transport
        if t is None or self.state is LinkState.DOWN:
            raise LinkError(str(self.endpoint), "link is down")
        try:
            await t.send(self.codec.encode(msg))
        except LinkError:
            self.stats.send_errors += 1
            raise

    @asynccontextmanager
    async def listen(self, max_buffer: int = 0) -> AsyncIterator[MemoryObjectReceiveStream[MavMessage]]:
        size = max_buffer or self.config.listener_buffer
        send, recv = anyio.create_memory_object_stream[MavMessage](size)
        self._listeners.add(send)
        try:
            async with recv:
                yield recv
        finally:
            self._listeners.discard(send)
            send.close()

    async def wait_ready(self) -> None:
        """Return once the first autopilot heartbeat has arrived."""
        await self._ready.wait()

    # -- internals -------------------------------------------------------
    def _set_state(self, new: LinkState) -> None:
        old = self.state
        if old is new:
            return
        self.state = new
        log.info("link_state", vehicle=self.name, endpoint=str(self.endpoint), state=new.value, previous=old.value)
        if self._on_state is not None:
            self._on_state(old, new)

    def _autopilot_heartbeat(self, src_system: int, src_component: int, now: float) -> int:
        """An autopilot's HEARTBEAT: the first names the vehicle; the vehicle's keep the link up. Returns the target."""
        if self._target_system == 0:
            self._target_system = src_system
            self._target_component = src_component
        if src_system == self._target_system:
            self.last_heartbeat_mono = now
            if self.state is not LinkState.UP:
                self._set_state(LinkState.UP)
                self._ready.set()
        return self._target_system

    def _dispatch(self, msgs: list[MavMessage], recv_ns: int) -> None:
        # Per message and per read at a thousand vehicles: locals, and the rare work in a call.
        now = time.monotonic()
        target = self._target_system
        seen = self._last_seen_mono
        vehicle: list[MavMessage] = []
        keep = vehicle.append
        for msg in msgs:
            kind = msg._type
            hdr = msg._header
            if kind == "HEARTBEAT" and is_autopilot_heartbeat(msg.type, msg.autopilot):
                target = self._autopilot_heartbeat(hdr.srcSystem, hdr.srcComponent, now)
            if hdr.srcSystem == target:
                seen[kind] = now
                keep(msg)
        if vehicle:
            self._on_messages(vehicle, recv_ns)
        if self._listeners:
            for send in list(self._listeners):
                for msg in msgs:
                    try:
                        send.send_nowait(msg)
                    except anyio.WouldBlock:
                        self.stats.listener_drops += 1
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                        self._listeners.discard(send)
                        break

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Connect, read, keep alive and reconnect forever (until cancelled)."""
        backoff = Backoff(initial_s=self.config.backoff_initial_s, max_s=self.config.backoff_max_s)
        started = False
        while True:
            try:
                if self.transport_factory is not None:
                    transport = await self.transport_factory()
                else:
                    transport = await open_transport(self.endpoint, connect_timeout_s=self.config.connect_timeout_s)
            except LinkError as exc:
                self._set_state(LinkState.DOWN)
                if not started:
                    task_status.started()
                    started = True
                delay = backoff.next_delay_s()
                log.warning("link_connect_failed", vehicle=self.name, error=exc.reason, retry_in_s=round(delay, 2))
                await anyio.sleep(delay)
                continue
            self._transport = transport
            self._splitter = FrameSplitter()
            self.codec.resync()  # a connect starts mid-stream: its first partial frame is not link damage
            self.stats.connects += 1
            self._interval_supported = None
            self._last_seen_mono.clear()
            self._set_state(LinkState.CONNECTING if self.last_heartbeat_mono == 0 else LinkState.LOST)
            if not started:
                task_status.started()
                started = True
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._heartbeat_loop, name=f"vehicle[{self.name}].link.heartbeat")
                    tg.start_soon(self._watchdog_loop, name=f"vehicle[{self.name}].link.watchdog")
                    tg.start_soon(self._stream_loop, name=f"vehicle[{self.name}].link.streams")
                    await self._read_loop(transport)
                    tg.cancel_scope.cancel()
                backoff.reset()
            except* LinkError as group:
                # The reader and the heartbeat sender often fail together when
                # the peer goes away: one log line for the lot.
                reasons = sorted({e.reason for e in group.exceptions if isinstance(e, LinkError)})
                log.warning("link_error", vehicle=self.name, error="; ".join(reasons))
            finally:
                self._transport = None
                self.stats.disconnects += 1
                with anyio.CancelScope(shield=True):
                    await transport.aclose()
                self._set_state(LinkState.DOWN)
            await anyio.sleep(backoff.next_delay_s())

    def _on_bytes(self, data: bytes) -> None:
        if self._taps:
            self._tap(data)
        try:
            msgs = self.codec.feed(data)
            if msgs:
                self._dispatch(msgs, time.time_ns())
        except Exception:  # runs in the selector callback: never let it tear the transport down
            log.exception("link_dispatch_failed", vehicle=self.name)

    async def _read_loop(self, transport: Transport) -> None:
        start_reading = getattr(transport, "start_reading", None)
        if start_reading is not None:
            # Push mode: bytes are decoded in the transport's callback.
            start_reading(self._on_bytes)
            await transport.wait_closed()  # type: ignore[attr-defined]
            return
        feed = self.codec.feed
        dispatch = self._dispatch
        while True:
            data = await transport.recv()
            if self._taps:
                self._tap(data)
            msgs = feed(data)
            if msgs:
                dispatch(msgs, time.time_ns())

    async def _heartbeat_loop(self) -> None:
        t = self._transport
        while t is not None:
            await t.send(self.codec.encode_constant(GATEWAY_HEARTBEAT))
            await anyio.sleep(self.config.heartbeat_interval_s)

    async def _watchdog_loop(self) -> None:
        # Sleep until the heartbeat deadline rather than polling: one wake-up
        # per timeout period per vehicle matters at a thousand vehicles.
        timeout = self.config.heartbeat_timeout_s
        while True:
            if self.state is LinkState.UP:
                remaining = timeout - (time.monotonic() - self.last_heartbeat_mono)
                if remaining <= 0:
                    self._set_state(LinkState.LOST)
                    remaining = timeout
            else:
                remaining = timeout / 2
            await anyio.sleep(remaining + 0.01)

    async def _stream_loop(self) -> None:
        """Ask for the streams we need; ask again for any that went quiet (e.g. after a reboot)."""
        await self._ready.wait()
        last_request: dict[str, float] = {}
        # A stream is quiet when it missed a few of its own intervals, never sooner than
        # stream_stale_s: HOME_POSITION at 0.2 Hz against a 5 s bound was asked for again
        # whenever a check fell just before its next sample (and always with a shorter bound).
        quiet_s = {name: max(self.config.stream_stale_s, STALE_INTERVALS / hz)
                   for name, hz in self.config.streams_hz.items()}
        while True:
            if self.state is LinkState.UP:
                now = time.monotonic()
                stale = [
                    name for name, limit in quiet_s.items()
                    if now - self._last_seen_mono.get(name, 0.0) > limit
                    and now - last_request.get(name, 0.0) > limit
                ]
                if stale:
                    await self._request_streams(stale)
                    for name in stale:
                        last_request[name] = now
            await anyio.sleep(self.config.stream_check_interval_s)

    async def _request_streams(self, names: list[str]) -> None:
        self.stats.stream_requests += 1
        ts, tc = self._target_system, self._target_component
        if self._interval_supported is not False:
            acks = 0
            async with self.listen(64) as inbox:
                for name in names:
                    msg_id = getattr(mavlink2, f"MAVLINK_MSG_ID_{name}")
                    interval_us = int(1e6 / self.config.streams_hz[name])
                    await self.send(
                        mavlink2.MAVLink_command_long_message(
                            ts, tc, mavlink2.MAV_CMD_SET_MESSAGE_INTERVAL, 0, msg_id, interval_us, 0, 0, 0, 0, 0
                        )
                    )
                with anyio.move_on_after(self.config.heartbeat_timeout_s):
                    async for msg in inbox:
                        if msg._type == "COMMAND_ACK" and msg.command == mavlink2.MAV_CMD_SET_MESSAGE_INTERVAL:
                            if msg.result == mavlink2.MAV_RESULT_ACCEPTED:
                                acks += 1
                                if acks >= len(names):
                                    break
                            else:
                                self._interval_supported = False
                                break
            if acks:
                self._interval_supported = True
                if acks >= len(names):
                    return
            else:
                self._interval_supported = False
        # Fallback: the older, coarser REQUEST_DATA_STREAM.
        for stream_id, rep in _DATA_STREAMS:
            hz = max(1, round(self.config.streams_hz.get(rep, 1.0)))
            await self.send(mavlink2.MAVLink_request_data_stream_message(ts, tc, stream_id, hz, 1))
        log.info("streams_requested", vehicle=self.name, method="REQUEST_DATA_STREAM", messages=names)
