"""A live MAVLink link to one vehicle: the real `MavPort`.

It owns the transport (reconnecting with capped, jittered backoff), the codec,
the gateway's 1 Hz HEARTBEAT as an onboard controller, link-loss detection by
heartbeat timeout, and a `StreamKeeper` for the stream requests
(drivers/mavlink/streamkeeper.py). The heartbeat, the watchdog and the stream
check run on the event loop's one timer for every link
(drivers/mavlink/chores.py), not in tasks of their own. Decoded messages go to
one synchronous callback in batches (the hot path) and to any bounded
listeners (protocol runners). The gateway does not use a link directly: it
talks to the vehicle's `mavjet.drivers.mavlink.session.Session`, which owns the link.

The per-read path (decode, the vehicle's messages, its HEARTBEAT) is
drivers/mavlink/inbound.py, which the gateway compiles with the rest of its
hot path. Routing (gateway/routes.py) taps the whole frames received, as bytes
(`tap_frames`), and injects frames as they are (`send_raw`): the `FrameTap`
seam. The link's reconnect, keep-alive and tap duties stay in one module:
they share its transport and state.
"""

from __future__ import annotations

import asyncio
import math
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

from mavjet.contract.errors import ConfigError, LinkError, NotOwnerError
from mavjet.drivers.mavlink.backoff import Backoff
from mavjet.drivers.mavlink.chores import Chores
from mavjet.drivers.mavlink.codec import (
    GATEWAY_COMPONENT_ID,
    GATEWAY_SYSTEM_ID,
    ConstantMessage,
    MavCodec,
)
from mavjet.drivers.mavlink.dialect import MavMessage, mavlink2
from mavjet.drivers.mavlink.inbound import Inbound, OnMessages
from mavjet.drivers.mavlink.router import FrameSplitter
from mavjet.drivers.mavlink.signing import MavSigning
from mavjet.drivers.mavlink.streamkeeper import StreamKeeper
from mavjet.drivers.mavlink.transport import Endpoint, Transport, open_transport

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

# What the gateway says it is, once a second on every link: an onboard controller, active.
GATEWAY_HEARTBEAT = ConstantMessage(mavlink2.MAVLink_heartbeat_message(
    mavlink2.MAV_TYPE_ONBOARD_CONTROLLER, mavlink2.MAV_AUTOPILOT_INVALID, 0, 0, mavlink2.MAV_STATE_ACTIVE, 3))

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
    send_errors: int = 0
    heartbeats_skipped: int = 0  # the peer left more than a socket's high water unread
    refused_not_owner: int = 0  # frames a standby or fenced gateway did not send (`MavlinkLink.gate`)


OnState = Callable[[LinkState, LinkState], None]
# Whether this gateway may act for the vehicle now (its owner, not fenced: gateway/ownership).
Gate = Callable[[], bool]


def passes_standby(msg: MavMessage) -> bool:
    """What a gateway that does not own the vehicle may still send: asking to hear it.

    A standby keeps decoding so it can take over at once, so it may ask for its
    streams on its own link (REQUEST_DATA_STREAM, SET_MESSAGE_INTERVAL): they
    change what the vehicle sends on that link, nothing it does. Heartbeats go
    out below this check (`_LinkChores`). Everything else acts and needs the lease.
    """
    mid = msg.get_msgId()
    if mid == mavlink2.MAVLINK_MSG_ID_REQUEST_DATA_STREAM:
        return True
    return mid == mavlink2.MAVLINK_MSG_ID_COMMAND_LONG and bool(
        msg.command == mavlink2.MAV_CMD_SET_MESSAGE_INTERVAL)  # type: ignore[attr-defined]

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
        self._on_state = on_state
        self._transport: Transport | None = None
        self._listeners: set[MemoryObjectSendStream[MavMessage]] = set()
        self.last_heartbeat_mono = 0.0
        self._inbound = Inbound(name=name, codec=self.codec, on_messages=on_messages,
                                on_heartbeat=self._autopilot_heartbeat, target_system=expected_sysid or 0)
        self.streams = StreamKeeper(self, streams_hz=config.streams_hz, stale_s=config.stream_stale_s,
                                    ack_timeout_s=config.heartbeat_timeout_s, last_seen=self._inbound.last_seen_mono)
        self._ready = anyio.Event()
        # Raw-frame taps: only when something taps the link does it split frames a second time.
        self._taps: list[OnFrames] = []
        self._splitter = FrameSplitter()
        # None: this link acts whenever asked (no ownership). Checked right before each write, with
        # no await between the check and the write: the fence is a point in time (docs/ownership.md).
        self.gate: Gate | None = None

    # -- raw frames (FrameTap) -------------------------------------------
    def tap_frames(self, handler: OnFrames) -> Callable[[], None]:
        self._taps.append(handler)
        self._inbound.tap = self._tap

        def untap() -> None:
            if handler in self._taps:
                self._taps.remove(handler)
            if not self._taps:
                self._inbound.tap = None

        return untap

    async def send_raw(self, data: bytes) -> None:
        t = self._transport
        if t is None or self.state is LinkState.DOWN:
            raise LinkError(str(self.endpoint), "link is down")
        gate = self.gate
        if gate is not None and not gate():  # a ground station's frames act: the owner's only
            self.stats.refused_not_owner += 1
            raise NotOwnerError(str(self.endpoint), "not the vehicle's owner (standby or fenced)")
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
        return self._inbound.target_system

    @property
    def target_component(self) -> int:
        return self._inbound.target_component

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
        gate = self.gate
        if gate is not None and not gate() and not passes_standby(msg):
            self.stats.refused_not_owner += 1
            raise NotOwnerError(str(self.endpoint), f"{msg.get_type()} not sent: not the vehicle's owner (standby or fenced)")
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
        self._inbound.fan_out = self._fan_out
        try:
            async with recv:
                yield recv
        finally:
            self._listeners.discard(send)
            if not self._listeners:
                self._inbound.fan_out = None
            send.close()

    async def wait_ready(self) -> None:
        """Return once the first autopilot heartbeat has arrived."""
        await self._ready.wait()

    def heartbeats_stopped(self) -> None:
        """The watchdog's verdict (`_LinkChores`): no heartbeat within the timeout, the link is lost."""
        self._set_state(LinkState.LOST)

    # -- internals -------------------------------------------------------
    def _set_state(self, new: LinkState) -> None:
        old = self.state
        if old is new:
            return
        self.state = new
        log.info("link_state", vehicle=self.name, endpoint=str(self.endpoint), state=new.value, previous=old.value)
        if self._on_state is not None:
            self._on_state(old, new)

    def _autopilot_heartbeat(self, now: float) -> None:
        """A HEARTBEAT of the vehicle's autopilot (drivers/mavlink/inbound.py): it keeps the link up."""
        self.last_heartbeat_mono = now
        if self.state is not LinkState.UP:
            self._set_state(LinkState.UP)
            self._ready.set()

    def _fan_out(self, msgs: list[MavMessage]) -> None:
        # Every message to every listener (protocol runners), never waiting: a full listener drops.
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
            self._inbound.last_seen_mono.clear()
            self.streams.reset()
            self._set_state(LinkState.CONNECTING if self.last_heartbeat_mono == 0 else LinkState.LOST)
            if not started:
                task_status.started()
                started = True
            # The heartbeat, the watchdog and the stream check run on the loop's one timer
            # (drivers/mavlink/chores.py), the heartbeat only where the transport can send
            # without waiting (the epoll TCP links); elsewhere it keeps a task.
            send_nowait = getattr(transport, "send_nowait", None)
            chores = _LinkChores(self, send_nowait)
            Chores.for_loop(asyncio.get_running_loop()).add(chores, time.monotonic())
            try:
                async with anyio.create_task_group() as tg:
                    if send_nowait is None:
                        tg.start_soon(self._heartbeat_loop, name=f"vehicle[{self.name}].link.heartbeat")
                    tg.start_soon(self.streams.run, name=f"vehicle[{self.name}].link.streams")
                    await self._read_loop(transport)
                    tg.cancel_scope.cancel()
                backoff.reset()
            except* LinkError as group:
                # The reader and the heartbeat sender often fail together when
                # the peer goes away: one log line for the lot.
                reasons = sorted({e.reason for e in group.exceptions if isinstance(e, LinkError)})
                log.warning("link_error", vehicle=self.name, error="; ".join(reasons))
            finally:
                chores.active = False  # its next run drops it
                self._transport = None
                self.stats.disconnects += 1
                with anyio.CancelScope(shield=True):
                    await transport.aclose()
                self._set_state(LinkState.DOWN)
            await anyio.sleep(backoff.next_delay_s())

    async def _read_loop(self, transport: Transport) -> None:
        start_reading = getattr(transport, "start_reading", None)
        if start_reading is not None:
            # Push mode: bytes are decoded in the transport's callback.
            start_reading(self._inbound.on_bytes)
            await transport.wait_closed()  # type: ignore[attr-defined]
            return
        receive = self._inbound.receive
        while True:
            receive(await transport.recv())

    async def _heartbeat_loop(self) -> None:
        # Only for a transport that cannot send without waiting (UDP, serial, asyncio's TCP).
        t = self._transport
        while t is not None:
            await t.send(self.codec.encode_constant(GATEWAY_HEARTBEAT))
            await anyio.sleep(self.config.heartbeat_interval_s)


class _LinkChores:
    """A connected link's heartbeat, watchdog and stream check, run by the loop's `Chores`.

    The heartbeat goes out every `heartbeat_interval_s` through `send_nowait`
    (None: the link's heartbeat task sends it); one the transport cannot take
    now (its peer left more than the high water unread) is skipped and
    counted. The watchdog calls the link lost once no vehicle heartbeat came
    for `heartbeat_timeout_s`; every `stream_check_interval_s` the stream
    keeper is told to look for quiet streams.
    """

    __slots__ = ("_link", "_next_heartbeat", "_next_stream_check", "_send", "active")

    def __init__(self, link: MavlinkLink, send_nowait: Callable[[bytes], bool] | None) -> None:
        self._link = link
        self._send = send_nowait
        now = time.monotonic()
        self._next_heartbeat = now if send_nowait is not None else math.inf
        self._next_stream_check = now + link.config.stream_check_interval_s
        self.active = True  # false once the connection ends: the next run drops the job

    def run(self, now: float) -> float | None:
        if not self.active:
            return None
        link = self._link
        cfg = link.config
        if self._send is not None and now >= self._next_heartbeat:
            if not self._send(link.codec.encode_constant(GATEWAY_HEARTBEAT)):
                link.stats.heartbeats_skipped += 1
            self._next_heartbeat += cfg.heartbeat_interval_s
            if self._next_heartbeat <= now:  # ran late by more than an interval: no burst to catch up
                self._next_heartbeat = now + cfg.heartbeat_interval_s
        due = self._next_heartbeat
        if link.state is LinkState.UP:
            remaining = cfg.heartbeat_timeout_s - (now - link.last_heartbeat_mono)
            if remaining <= 0:
                link.heartbeats_stopped()
            else:
                due = min(due, now + remaining + 0.01)
        if now >= self._next_stream_check:
            self._next_stream_check = now + cfg.stream_check_interval_s
            if link.state is LinkState.UP:
                link.streams.check(now)
        return min(due, self._next_stream_check)
