"""One vehicle's commands in the gateway's hands: run one at a time, in publish order.

The intake (`gateway/commands/intake.py`) pulls deliveries from a consumer
that may carry many vehicles and offers each to its vehicle's lane. The lane
keeps them (an `in_progress` keep-alive each, from arrival to their end),
ordered by stream sequence, and runs them through the vehicle's executor
one after another, in its own task: a vehicle whose command waits for an
ACK, or for the link to come back, holds up only its own later commands.

A retry (link down, TEMPORARILY_REJECTED) waits here and runs again; it is
not nak'd to the server, where it would come back behind later commands the
consumer has already handed out (`gateway/commands/delivery.py`).

Room is bounded (`commands.max_queued_per_vehicle`): a delivery that finds
its lane full ends at once as `rejected`, saying so, rather than taking the
gateway's budget (the consumer's MaxAckPending) from other vehicles.

A lane whose vehicle stops being this gateway's (ownership) or whose gateway
is stopping hands back what waits, at once; the executor hands back the one
that runs at its next check (docs/ownership.md).
"""

from __future__ import annotations

import bisect
import time
from typing import Protocol

import anyio
from nats.aio.msg import Msg

from mavjet.gateway.commands.delivery import CommandDelivery, HeldDelivery
from mavjet.gateway.commands.executor import Disposition
from mavjet.gateway.commands.keepalive import KeepAlives


class Acting(Protocol):
    """The vehicle as a lane sees it (`VehicleHandle` is one)."""

    @property
    def vid(self) -> str: ...

    def may_act(self) -> bool: ...


class Executes(Protocol):
    """What a lane asks of its vehicle's executor (`CommandExecutor`; `mavjet bench scale` has a light one)."""

    async def handle(self, msg: CommandDelivery) -> Disposition: ...

    async def hand_back(self, msg: CommandDelivery, why: str) -> Disposition: ...

    async def refuse(self, msg: CommandDelivery, detail: str) -> Disposition | None: ...


class VehicleLane:
    """The deliveries of one vehicle held by this gateway, and the task that runs them."""

    def __init__(self, vehicle: Acting, executor: Executes, keepalives: KeepAlives, *,
                 max_queued: int) -> None:
        self.vehicle = vehicle
        self.vid = vehicle.vid
        self.executor = executor
        self.keepalives = keepalives
        self.max_queued = max_queued
        self._waiting: list[HeldDelivery] = []  # by stream sequence; the running one is not here
        self._held: dict[int, int] = {}  # stream sequence -> keep-alive token, running one included
        self._wake = anyio.Event()
        self.idle = anyio.Event()  # set while no delivery is in hand (`CommandService.drain` waits for it)
        self.idle.set()
        self.draining = False  # take nothing new (a stop handing the vehicle over)
        self.binds = 0  # times a consumer carrying this vehicle's commands was bound
        self.refused = 0  # deliveries rejected at once for want of room
        self.dispositions: dict[str, int] = {}

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def offer(self, msg: Msg) -> HeldDelivery | None:
        """Take a delivery; returns it back when the lane has no room (the caller refuses it)."""
        held = HeldDelivery(msg)
        if held.stream_seq in self._held:
            # The server's redelivery of one held here (its ack timer ran out under a stalled event loop):
            # the copy held already answers for it.
            return None
        if len(self._waiting) >= self.max_queued and not self.draining:
            return held
        self.admit(held)
        return None

    def admit(self, held: HeldDelivery) -> None:
        self._held[held.stream_seq] = self.keepalives.hold(held.in_progress)
        bisect.insort(self._waiting, held, key=lambda d: d.stream_seq)
        self._wake.set()

    def kick(self) -> None:
        """Look again at ownership and draining now (a change the intake saw)."""
        self._wake.set()

    async def refuse(self, held: HeldDelivery) -> None:
        """End a delivery there is no room for, beside the running command (see module docstring)."""
        token = self.keepalives.hold(held.in_progress)
        try:
            done = await self.executor.refuse(
                held, f"{len(self._waiting)} commands already wait for {self.vid} "
                      f"(commands.max_queued_per_vehicle): not queued, not sent")
        finally:
            self.keepalives.release(token)
        if done is None:  # a previous owner's command in flight: it must be recovered, in its turn
            self.admit(held)
            return
        self.refused += 1
        self._count(done)

    async def run(self) -> None:
        while True:
            if not self._waiting:
                await self._wake.wait()
                self._wake = anyio.Event()
                continue
            why = self._cannot_run()
            if why is not None:
                await self._hand_back_waiting(why)
                continue
            held = self._waiting.pop(0)
            self.idle = anyio.Event()
            try:
                await self._run_one(held)
            finally:
                self.keepalives.release(self._held.pop(held.stream_seq, 0))
                self.idle.set()

    async def _run_one(self, held: HeldDelivery) -> None:
        while True:
            self._count(await self.executor.handle(held))
            delay_s = held.take_retry()
            if delay_s is None:
                return
            # Not finished: again after the delay, unless the vehicle stops being this gateway's meanwhile.
            until = time.monotonic() + delay_s
            while (left_s := until - time.monotonic()) > 0 and self._cannot_run() is None:
                with anyio.move_on_after(left_s):
                    await self._wake.wait()
                self._wake = anyio.Event()
            why = self._cannot_run()
            if why is not None:
                self._count(await self.executor.hand_back(held, why))
                return
            held.retries += 1

    def _cannot_run(self) -> str | None:
        if self.draining:
            return "the gateway is stopping"
        if not self.vehicle.may_act():
            return "not the vehicle's owner"
        return None

    async def _hand_back_waiting(self, why: str) -> None:
        waiting, self._waiting = self._waiting, []
        for held in waiting:
            self.keepalives.release(self._held.pop(held.stream_seq, 0))
            self._count(await self.executor.hand_back(held, why))
        if self.draining:
            # Stopping: whatever still comes is handed back as it arrives, until the task is cancelled.
            self._wake = anyio.Event()

    def _count(self, done: Disposition) -> None:
        self.dispositions[done] = self.dispositions.get(done, 0) + 1
