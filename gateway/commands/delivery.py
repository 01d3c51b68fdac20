"""One command delivery as the executor sees it: the seam between the JetStream message and the rules.

The executor decides what happens to a delivery (ack, term, retry later,
hand back); the vehicle's lane (`gateway/commands/lane.py`) decides how. A
retry is the lane's own: it keeps the message (its `in_progress` keep-alives
continue) and runs it again after the delay, instead of nak'ing it to the
server. With one consumer for many vehicles, a nak'd command would come back
behind the vehicle's later commands the server has already handed out; held
here, a vehicle's commands keep their publish order whatever the consumer
carries. `delivered` counts the server's deliveries and the lane's retries,
so MaxDeliver still bounds the attempts of a command.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from nats.aio.msg import Msg

# A delivery given back (this gateway does not own the vehicle now) comes again after this long, not at once:
# until the consumer's filter follows the ownership change (up to a second for a fence), an immediate
# redelivery would come straight back here, and each round would spend one of the command's MaxDeliver.
HAND_BACK_DELAY_S = 0.5


class CommandDelivery(Protocol):
    """What the executor may read of a delivery and do with it."""

    @property
    def subject(self) -> str: ...

    @property
    def data(self) -> bytes: ...

    @property
    def headers(self) -> Mapping[str, str] | None: ...

    @property
    def delivered(self) -> int:
        """Attempts so far, this one included (the server's deliveries plus the lane's retries)."""

    @property
    def stream_seq(self) -> int: ...

    async def ack_sync(self, timeout_s: float) -> None:
        """Finished, accepted: acked and confirmed by the server."""

    async def term(self) -> None:
        """Finished, not accepted: never delivered again."""

    async def hand_back(self) -> None:
        """Give it back to the server at once (not this gateway's to run): whoever owns the vehicle gets it."""

    def retry_later(self, delay_s: float) -> None:
        """Not finished: run it again after `delay_s` (the lane keeps it meanwhile)."""


class HeldDelivery:
    """A JetStream message held by a vehicle's lane from delivery to its end (`CommandDelivery`)."""

    __slots__ = ("ended", "msg", "retries", "retry_in_s", "stream_seq")

    def __init__(self, msg: Msg) -> None:
        self.msg = msg
        md = msg.metadata
        self.stream_seq = int(md.sequence.stream) if md.sequence and md.sequence.stream else 0
        self.retries = 0  # the lane's own re-runs of this delivery
        self.retry_in_s: float | None = None  # set by `retry_later`, taken by the lane
        self.ended = False  # acked, terminated or handed back: nothing more to keep alive

    @property
    def subject(self) -> str:
        return self.msg.subject

    @property
    def data(self) -> bytes:
        return self.msg.data

    @property
    def headers(self) -> Mapping[str, str] | None:
        return self.msg.headers

    @property
    def delivered(self) -> int:
        return int(self.msg.metadata.num_delivered or 1) + self.retries

    async def ack_sync(self, timeout_s: float) -> None:
        self.ended = True
        await self.msg.ack_sync(timeout=timeout_s)

    async def term(self) -> None:
        self.ended = True
        await self.msg.term()

    async def hand_back(self) -> None:
        self.ended = True
        await self.msg.nak(delay=HAND_BACK_DELAY_S)

    async def in_progress(self) -> None:
        if not self.ended:
            await self.msg.in_progress()

    def retry_later(self, delay_s: float) -> None:
        self.retry_in_s = delay_s

    def take_retry(self) -> float | None:
        """The delay of a retry the executor asked for (once), or None."""
        delay, self.retry_in_s = self.retry_in_s, None
        return delay
