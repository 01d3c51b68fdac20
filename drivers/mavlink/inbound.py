"""A link's inbound hot path: the bytes of one read become the vehicle's batch of messages.

Every read of every vehicle's link runs this: feed the codec, note which
messages came from the vehicle (and when, for the stream keeper), spot the
autopilot's HEARTBEAT, and hand the vehicle's messages to its twin in one
call. It is a module of its own so that mypyc can compile it with the rest of
the hot path (ops/compile.py): drivers/mavlink/link.py cannot be
compiled (its reconnect loop uses `except*`), and this path ran there
interpreted between two compiled calls, the codec's and the twin's (compiled,
the gateway's CPU a message did not change by more than the ingest benchmark
resolves: docs/benchmarks.md). It is sans-IO: tests feed it a real
ArduCopter's bytes. The link owns an `Inbound` and gives its transport
`on_bytes` as the read callback.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog

from mavjet.drivers.mavlink.autopilot import is_autopilot_heartbeat
from mavjet.drivers.mavlink.codec import MavCodec
from mavjet.drivers.mavlink.dialect import MavMessage

log = structlog.get_logger("mavjet.link")

# The vehicle's messages of one read, with the read's receive time (ns since the epoch).
OnMessages = Callable[[list[MavMessage], int], None]


class Inbound:
    """One link's decoding and dispatch. The link sets `tap` and `fan_out` while something uses them."""

    def __init__(self, *, name: str, codec: MavCodec, on_messages: OnMessages,
                 on_heartbeat: Callable[[float], None], target_system: int = 0) -> None:
        self.name = name
        self.codec = codec
        self.on_messages = on_messages
        # Called with time.monotonic() for each HEARTBEAT of the vehicle's autopilot.
        self._on_heartbeat = on_heartbeat
        # The vehicle's system id: given (a shared UDP port knows it), else the first autopilot heard.
        self.target_system = target_system
        self.target_component = 1
        # When each message type last came from the vehicle (time.monotonic()); the stream keeper reads it.
        self.last_seen_mono: dict[str, float] = {}
        # The read's bytes, before decoding (the link's frame taps); None while nothing taps.
        self.tap: Callable[[bytes], None] | None = None
        # Every message decoded, the vehicle's or not (the link's listeners); None while nobody listens.
        self.fan_out: Callable[[list[MavMessage]], None] | None = None

    def on_bytes(self, data: bytes) -> None:
        """A transport's read callback: `receive`, with a handler's error logged instead of raised."""
        try:
            self.receive(data)
        except Exception:  # runs in the transport's callback: never let it tear the transport down
            log.exception("link_dispatch_failed", vehicle=self.name)

    def receive(self, data: bytes) -> None:
        """Decode one read and hand on what it completes; raises what a handler raises."""
        tap = self.tap
        if tap is not None:
            tap(data)
        msgs = self.codec.feed(data)
        if msgs:
            self.dispatch(msgs, time.time_ns())

    def dispatch(self, msgs: list[MavMessage], recv_ns: int) -> None:
        # Per message and per read at a thousand vehicles: locals, and the rare work in a call.
        now = time.monotonic()
        target = self.target_system
        seen = self.last_seen_mono
        vehicle: list[MavMessage] = []
        for msg in msgs:
            kind: str = msg._type
            src: int = msg._header.srcSystem
            if kind == "HEARTBEAT" and is_autopilot_heartbeat(msg.type, msg.autopilot):
                if target == 0:  # the first autopilot names the vehicle
                    target = self.target_system = src
                    self.target_component = msg._header.srcComponent
                if src == target:
                    self._on_heartbeat(now)
            if src == target:
                seen[kind] = now
                vehicle.append(msg)
        if vehicle:
            self.on_messages(vehicle, recv_ns)
        fan_out = self.fan_out
        if fan_out is not None:
            fan_out(msgs)
