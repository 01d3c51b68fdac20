"""The seams between the daemon and the services it runs (commands, shadow).

A service is anything with `async run(ctx, *, task_status)` (`GatewayService`).
The daemon starts each one in its intake task group once the links are
started and cancels it at shutdown. Everything a service may use comes in the
`ServiceContext`, explicitly:

- `ctx.vehicles`: a `VehicleHandle` per vehicle: its MAVLink `Session`
  (mavjet.drivers.mavlink.session), a read-only view of its telemetry, its event
  stream, and the one way to publish an event for it;
- `ctx.nats`: the gateway's NATS connection (JetStream handle, readiness) and
  its event spool;
- `ctx.cfg` and `ctx.metrics`;
- `ctx.foreground`: work that must not wait behind state (a command between
  delivery and result) runs inside `ctx.foreground.running()`, and the
  daemon's state tick then yields in shorter steps.

Services never see the twin, the link or the publisher object behind these.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import anyio
import structlog
from anyio.abc import TaskStatus
from nats.aio.client import Client
from nats.js import JetStreamContext

from mavjet.contract.events import EventType
from mavjet.drivers.mavlink.modes import ModeTable
from mavjet.drivers.mavlink.session import Session
from mavjet.gateway.config import GatewayConfig
from mavjet.gateway.ownership.keeper import AlwaysOwner, Ownership
from mavjet.gateway.ownership.store import LeaseStore
from mavjet.gateway.publish.uplink import BulkPacer
from mavjet.gateway.runtime.metrics import GatewayMetrics
from mavjet.gateway.twin.telemetry import Event

__all__ = [
    "Drainable",
    "EventBus",
    "EventHandler",
    "GatewayService",
    "NatsAccess",
    "ServiceContext",
    "TelemetryView",
    "VehicleHandle",
]

log = structlog.get_logger("mavjet.services")

EventHandler = Callable[[Event], None]


class EventBus:
    """One vehicle's event stream: every event published for it, to every subscriber, in order.

    Handlers run synchronously where the event is published (often the link's
    receive callback), so they must be quick: set a flag, wake a task. A
    handler that raises is logged and does not stop the others.
    """

    __slots__ = ("_handlers", "_name")

    def __init__(self, name: str) -> None:
        self._name = name
        self._handlers: list[EventHandler] = []

    def subscribe(self, handler: EventHandler) -> Callable[[], None]:
        """Call `handler(event)` for every later event; returns the unsubscribe function."""
        self._handlers.append(handler)

        def unsubscribe() -> None:
            if handler in self._handlers:
                self._handlers.remove(handler)

        return unsubscribe

    def publish(self, ev: Event) -> None:
        for handler in self._handlers:
            try:
                handler(ev)
            except Exception:  # a subscriber's bug must not stop the vehicle's event publishing
                log.exception("event_handler_failed", vehicle=self._name, event=str(ev.type))

    def __len__(self) -> int:
        return len(self._handlers)


class LiveState(Protocol):
    """What a command's precondition reads of a vehicle's telemetry."""

    @property
    def armed(self) -> bool | None: ...

    @property
    def mode(self) -> str | None: ...

    @property
    def failsafe_active(self) -> bool: ...

    @property
    def landed_state(self) -> int | None: ...

    @property
    def flavour(self) -> str: ...

    @property
    def vehicle_class(self) -> str: ...

    @property
    def modes(self) -> ModeTable | None: ...


class TelemetryView(LiveState, Protocol):
    """What services read of a vehicle's live telemetry model (read-only)."""

    @property
    def vid(self) -> str: ...

    @property
    def last_boot_ms(self) -> int:
        """The autopilot's boot clock at the newest SYSTEM_TIME; it going backwards means a reboot."""

    def snapshot(self) -> dict[str, Any]:
        """The fields every event carries (mode, armed, position, battery, flavour)."""

    @property
    def channels(self) -> Mapping[str, Mapping[str, Any]]:
        """The newest sample of each state channel (position, battery, ...), as published to TWIN_STATE."""

    @property
    def sample_ns(self) -> Mapping[str, int]:
        """When each channel's newest sample was received (gateway clock, ns)."""


class VehicleHandle(Protocol):
    """What a service may use of one vehicle."""

    @property
    def vid(self) -> str: ...

    @property
    def flavour(self) -> str: ...

    @property
    def session(self) -> Session: ...

    @property
    def telemetry(self) -> TelemetryView: ...

    def subscribe(self, handler: EventHandler) -> Callable[[], None]:
        """Every event of this vehicle (telemetry, link, commands, shadow), in order."""

    def emit(self, etype: EventType, **data: Any) -> None:
        """Record, publish and fan out a gateway-side event, with the vehicle snapshot (a catalogue type)."""

    def publish_event(self, ev: Event, *, payload: bytes | None = None, enqueue: bool = True) -> None:
        """Publish an event built elsewhere: count it, enqueue it for JetStream, tell subscribers.

        `payload` replaces the envelope packed from `ev` (a stored payload);
        `enqueue=False` when the caller has already spooled it (counted and
        fanned out only).
        """

    def report_error(self, where: str) -> None:
        """Count an error and log its traceback (rate limited) without stopping anything."""

    def may_act(self) -> bool:
        """True while this gateway owns the vehicle and may act for it (ask right before acting)."""

    def may_record(self) -> bool:
        """True while what the vehicle says may be recorded here (the owner; or no other owner known)."""


class NatsAccess(Protocol):
    """The gateway's one NATS connection, as services see it."""

    @property
    def connected(self) -> anyio.Event:
        """Set while connected (a new Event after a disconnect)."""

    @property
    def nc(self) -> Client | None: ...

    @property
    def js(self) -> JetStreamContext | None: ...

    @property
    def is_connected(self) -> bool: ...

    def enqueue_event(self, subject: str, msg_id: str, payload: bytes) -> None:
        """Queue an event for the spool (durable) and JetStream (deduplicated by msg id)."""

    async def flush_pending_to_spool(self) -> None:
        """Make every queued event durable in the spool now."""

    async def publish_event_now(self, subject: str, msg_id: str, payload: bytes) -> bool:
        """Publish an event to JetStream without the spool, if that keeps its vehicle's events in order.

        True once the stream has it; False when the caller must hand it to the spool instead.
        """


class Foreground:
    """Work that must not wait behind state, counted while it runs (a command between its delivery
    and its result): meanwhile the fleet's state tick yields in shorter steps (`mavjet.gateway.daemon`),
    and `on_change(True)` / `on_change(False)` say when the first starts and the last ends (the
    daemon shortens the fleet's read passes with it: drivers/mavlink/reactor.py `set_urgent`)."""

    __slots__ = ("_on_change", "active")

    def __init__(self, on_change: Callable[[bool], None] | None = None) -> None:
        self.active = 0
        self._on_change = on_change

    @contextmanager
    def running(self) -> Iterator[None]:
        self.active += 1
        if self.active == 1 and self._on_change is not None:
            self._on_change(True)
        try:
            yield
        finally:
            self.active -= 1
            if self.active == 0 and self._on_change is not None:
                self._on_change(False)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceContext:
    """Everything a service gets from the daemon (see the module docstring)."""

    cfg: GatewayConfig
    vehicles: Mapping[str, VehicleHandle]
    nats: NatsAccess
    metrics: GatewayMetrics
    bulk: BulkPacer | None = None  # paces bulk transfers on a thin uplink (gateway/publish/uplink.py)
    foreground: Foreground = field(default_factory=Foreground)
    # Who may act for each vehicle (gateway/ownership): services act only while `may_act(vid)`.
    ownership: Ownership = field(default_factory=AlwaysOwner)
    # With ownership: TWIN_LEASES, where the commands in flight are kept for the next owner
    # (gateway/commands/shared.py), and this gateway's identity as written there.
    leases: LeaseStore | None = None
    holder: str = ""

    async def jetstream(self) -> tuple[Client, JetStreamContext]:
        """The live connection and JetStream handle, waiting for NATS if it is away."""
        while True:
            await self.nats.connected.wait()
            nc, js = self.nats.nc, self.nats.js
            if nc is not None and js is not None and nc.is_connected:
                return nc, js
            await anyio.sleep(0.2)


class GatewayService(Protocol):
    """A service the daemon runs for its whole life (commands, shadow)."""

    async def run(self, ctx: ServiceContext, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; call `task_status.started()` once serving."""


@runtime_checkable
class Drainable(Protocol):
    """A service that can stop taking new work and finish what it holds (a stop with ownership)."""

    async def drain(self) -> None:
        """Take nothing new; return once nothing is in hand (the caller bounds the wait)."""
