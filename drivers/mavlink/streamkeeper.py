"""Asking a vehicle for the streams the gateway needs, and again for any that went quiet.

SET_MESSAGE_INTERVAL for each message, and REQUEST_DATA_STREAM as the
fallback ArduPilot SITL needs: an autopilot that refuses or ignores the first
gets the second from then on. A link (drivers/mavlink/link.py) owns one
`StreamKeeper`: its `run` task asks once the vehicle is known, and then only
when the link's chores (drivers/mavlink/chores.py) found a quiet stream in
one of their checks, so a link whose streams flow never wakes it.
"""

from __future__ import annotations

import time
from contextlib import AbstractAsyncContextManager
from typing import Protocol

import anyio
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream

from mavjet.drivers.mavlink.dialect import MavMessage, mavlink2

log = structlog.get_logger("mavjet.link")

# A stream is asked for again after this many of its intervals without a sample (and the stale bound).
STALE_INTERVALS = 2.5

# REQUEST_DATA_STREAM groups covering the messages the gateway asks for (ArduPilot's mapping).
_DATA_STREAMS = (
    (mavlink2.MAV_DATA_STREAM_POSITION, "GLOBAL_POSITION_INT"),
    (mavlink2.MAV_DATA_STREAM_EXTRA1, "ATTITUDE"),
    (mavlink2.MAV_DATA_STREAM_EXTRA2, "VFR_HUD"),
    (mavlink2.MAV_DATA_STREAM_EXTENDED_STATUS, "SYS_STATUS"),
    (mavlink2.MAV_DATA_STREAM_EXTRA3, "BATTERY_STATUS"),
)


class StreamPort(Protocol):
    """What the keeper needs of a link."""

    name: str

    @property
    def target_system(self) -> int: ...

    @property
    def target_component(self) -> int: ...

    @property
    def is_up(self) -> bool: ...

    async def send(self, msg: MavMessage) -> None: ...

    def listen(self, max_buffer: int = 0) -> AbstractAsyncContextManager[MemoryObjectReceiveStream[MavMessage]]: ...

    async def wait_ready(self) -> None: ...


class StreamKeeper:
    """One link's stream requests. `last_seen` is the link's own map of message name to last arrival."""

    def __init__(self, port: StreamPort, *, streams_hz: dict[str, float], stale_s: float, ack_timeout_s: float,
                 last_seen: dict[str, float]) -> None:
        self._port = port
        self._streams_hz = streams_hz
        self._ack_timeout_s = ack_timeout_s
        self._last_seen = last_seen
        # A stream is quiet when it missed a few of its own intervals, never sooner than
        # stale_s: HOME_POSITION at 0.2 Hz against a 5 s bound was asked for again
        # whenever a check fell just before its next sample (and always with a shorter bound).
        self._quiet_s = {name: max(stale_s, STALE_INTERVALS / hz) for name, hz in streams_hz.items()}
        self._requested: dict[str, float] = {}
        self.interval_supported: bool | None = None
        self.requests = 0
        self._due = anyio.Event()

    def reset(self) -> None:
        """A new connection: the vehicle may have rebooted into other firmware."""
        self.interval_supported = None
        self._requested = {}

    def stale(self, now: float) -> list[str]:
        seen, requested = self._last_seen, self._requested
        return [name for name, limit in self._quiet_s.items()
                if now - seen.get(name, 0.0) > limit and now - requested.get(name, 0.0) > limit]

    def check(self, now: float) -> None:
        """Wake `run` if a stream went quiet (the link's chores call this every check interval)."""
        if not self._due.is_set() and self.stale(now):
            self._due.set()

    async def run(self) -> None:
        await self._port.wait_ready()
        while True:
            if self._port.is_up:
                now = time.monotonic()
                stale = self.stale(now)
                if stale:
                    await self.request(stale)
                    for name in stale:
                        self._requested[name] = now
            await self._due.wait()
            self._due = anyio.Event()

    async def request(self, names: list[str]) -> None:
        self.requests += 1
        port = self._port
        ts, tc = port.target_system, port.target_component
        if self.interval_supported is not False:
            acks = 0
            async with port.listen(64) as inbox:
                for name in names:
                    msg_id = getattr(mavlink2, f"MAVLINK_MSG_ID_{name}")
                    interval_us = int(1e6 / self._streams_hz[name])
                    await port.send(
                        mavlink2.MAVLink_command_long_message(
                            ts, tc, mavlink2.MAV_CMD_SET_MESSAGE_INTERVAL, 0, msg_id, interval_us, 0, 0, 0, 0, 0
                        )
                    )
                with anyio.move_on_after(self._ack_timeout_s):
                    async for msg in inbox:
                        if msg.get_type() == "COMMAND_ACK" and msg.command == mavlink2.MAV_CMD_SET_MESSAGE_INTERVAL:
                            if msg.result == mavlink2.MAV_RESULT_ACCEPTED:
                                acks += 1
                                if acks >= len(names):
                                    break
                            else:
                                self.interval_supported = False
                                break
            if acks:
                self.interval_supported = True
                if acks >= len(names):
                    return
            else:
                self.interval_supported = False
        # Fallback: the older, coarser REQUEST_DATA_STREAM.
        for stream_id, rep in _DATA_STREAMS:
            hz = max(1, round(self._streams_hz.get(rep, 1.0)))
            await port.send(mavlink2.MAVLink_request_data_stream_message(ts, tc, stream_id, hz, 1))
        log.info("streams_requested", vehicle=port.name, method="REQUEST_DATA_STREAM", messages=names)
