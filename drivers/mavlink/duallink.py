"""Two links to one vehicle, one of them active: a primary and a backup endpoint, as QGroundControl's multi-link.

`DualTransport` is a `Transport` (drivers/mavlink/transport.py) made of two:
the vehicle's link above it (`MavlinkLink`, its session, its protocol machines)
is unchanged and sees one byte stream. Both sides are kept connected and read;
only the **active** side's bytes go up, so every message is decoded once, and
everything the gateway sends goes down the active side, except heartbeats,
which go down both (the backup stays a link the vehicle keeps talking on).

Which side is active (`DualPolicy`, pure): the primary while it is heard; the
backup once the primary has been quiet for `switch_after_s` and the backup was
heard more recently (the issue's goal: within 2 s of the primary going quiet);
the primary again once it has been heard without a gap for `switch_back_s`
(hysteresis, so a flapping radio does not bounce the link). A side is "heard"
when bytes arrive from it: a vehicle streams telemetry several times a second.

A command in flight across a switch is the executor's business: its
retransmissions go down the new side, and it still ends in exactly one result
(docs/commands.md). A frame cut by the switch is skipped by the framer as junk.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

import anyio
import structlog

from mavjet.contract.errors import LinkError
from mavjet.drivers.mavlink.transport import Endpoint, Transport, open_transport

__all__ = ["DualPolicy", "DualTransport", "Side"]

log = structlog.get_logger("mavjet.link")

HEARTBEAT_MSGID = 0
CHECK_EVERY_S = 0.1


class Side(StrEnum):
    PRIMARY = "primary"
    BACKUP = "backup"


@dataclass(slots=True, kw_only=True)
class DualPolicy:
    """Which side is active, from when each was last heard (monotonic seconds). Sans-IO."""

    switch_after_s: float = 1.5
    switch_back_s: float = 5.0
    active: Side = Side.PRIMARY
    heard: dict[Side, float] = field(default_factory=lambda: {Side.PRIMARY: float("-inf"), Side.BACKUP: float("-inf")})
    # Since when the primary has been heard without a gap of `switch_after_s` (for the switch back).
    primary_steady_since: float | None = None
    switches: int = 0

    def on_heard(self, side: Side, now: float) -> None:
        gap = self.primary_steady_since is None or now - self.heard[Side.PRIMARY] > self.switch_after_s
        if side is Side.PRIMARY and gap:
            self.primary_steady_since = now
        self.heard[side] = now

    def decide(self, now: float) -> Side | None:
        """The side to switch to now, or None to stay."""
        quiet_primary = now - self.heard[Side.PRIMARY] > self.switch_after_s
        if self.active is Side.PRIMARY:
            if quiet_primary and self.heard[Side.BACKUP] > self.heard[Side.PRIMARY] and \
                    now - self.heard[Side.BACKUP] <= self.switch_after_s:
                return Side.BACKUP
            return None
        steady = self.primary_steady_since
        if not quiet_primary and steady is not None and now - steady >= self.switch_back_s:
            return Side.PRIMARY
        if now - self.heard[Side.BACKUP] > self.switch_after_s and not quiet_primary:
            return Side.PRIMARY  # the backup went quiet and the primary talks: no reason to wait
        return None

    def switch(self, to: Side) -> None:
        self.active = to
        self.switches += 1


def _is_heartbeat(data: bytes) -> bool:
    """A whole MAVLink 2 (or 1) HEARTBEAT frame, as the link's heartbeat task sends it."""
    if len(data) >= 10 and data[0] == 0xFD:
        return data[7] | (data[8] << 8) | (data[9] << 16) == HEARTBEAT_MSGID
    return len(data) >= 6 and data[0] == 0xFE and data[5] == HEARTBEAT_MSGID


class DualTransport:
    """A primary and a backup transport as one (module docstring). Push mode: `start_reading` + `wait_closed`."""

    def __init__(self, primary: Endpoint, backup: Endpoint, *, connect_timeout_s: float,
                 retry_s: float = 1.0, policy: DualPolicy | None = None,
                 on_switch: Callable[[Side, Side], None] | None = None) -> None:
        self.endpoint = primary
        self.endpoints = {Side.PRIMARY: primary, Side.BACKUP: backup}
        self.connect_timeout_s = connect_timeout_s
        self.retry_s = retry_s
        self.policy = policy or DualPolicy()
        self.on_switch = on_switch
        self._transports: dict[Side, Transport | None] = {Side.PRIMARY: None, Side.BACKUP: None}
        self._sink: Callable[[bytes], None] | None = None
        self._closed = anyio.Event()

    @property
    def active(self) -> Side:
        return self.policy.active

    @property
    def active_endpoint(self) -> Endpoint:
        return self.endpoints[self.policy.active]

    def connected(self, side: Side) -> bool:
        return self._transports[side] is not None

    # -- Transport ---------------------------------------------------------------------------------
    def start_reading(self, sink: Callable[[bytes], None]) -> None:
        self._sink = sink

    async def wait_closed(self) -> None:
        """Run both sides (connect, read, reconnect) and the switch check until closed."""
        async with anyio.create_task_group() as tg:
            for side in (Side.PRIMARY, Side.BACKUP):
                tg.start_soon(self._side, side, name=f"link.{side}")
            tg.start_soon(self._check, name="link.switch")
            await self._closed.wait()
            tg.cancel_scope.cancel()

    async def recv(self) -> bytes:
        raise LinkError(str(self.endpoint), "a dual link is read in push mode (start_reading)")

    async def send(self, data: bytes) -> None:
        if _is_heartbeat(data):
            # Both sides: the backup must stay a link the vehicle talks on. A side down is reconnecting
            # by itself (`_side`), so a heartbeat it misses is no error of the link above.
            for side in (Side.PRIMARY, Side.BACKUP):
                t = self._transports[side]
                if t is not None:
                    try:
                        await t.send(data)
                    except LinkError:
                        pass
            return
        t = self._transports[self.policy.active]
        if t is None:
            raise LinkError(str(self.active_endpoint), f"the {self.policy.active} link is not connected")
        await t.send(data)

    async def aclose(self) -> None:
        self._closed.set()
        for side, t in self._transports.items():
            if t is not None:
                self._transports[side] = None
                with anyio.CancelScope(shield=True):
                    await t.aclose()

    # -- the sides ---------------------------------------------------------------------------------
    async def _side(self, side: Side) -> None:
        endpoint = self.endpoints[side]
        while not self._closed.is_set():
            try:
                t = await open_transport(endpoint, connect_timeout_s=self.connect_timeout_s)
            except LinkError as exc:
                log.debug("dual_link_connect_failed", side=str(side), endpoint=str(endpoint), error=exc.reason)
                await anyio.sleep(self.retry_s)
                continue
            self._transports[side] = t
            try:
                while True:
                    data = await t.recv()
                    if not data:
                        continue
                    self.policy.on_heard(side, time.monotonic())
                    if side is self.policy.active and self._sink is not None:
                        self._sink(data)
            except LinkError as exc:
                log.info("dual_link_side_down", side=str(side), endpoint=str(endpoint), error=exc.reason)
            finally:
                self._transports[side] = None
                with anyio.CancelScope(shield=True):
                    await t.aclose()
            await anyio.sleep(self.retry_s)

    async def _check(self) -> None:
        while True:
            to = self.policy.decide(time.monotonic())
            if to is not None:
                was = self.policy.active
                self.policy.switch(to)
                log.warning("link_switched", endpoint=str(self.endpoints[to]), active=str(to), previous=str(was))
                if self.on_switch is not None:
                    self.on_switch(was, to)
            await anyio.sleep(CHECK_EVERY_S)
