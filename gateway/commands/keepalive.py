"""Keep commands' JetStream messages from redelivery while they run: `in_progress` acks, one task for all.

Each delivery a vehicle's lane holds, waiting or running, is held here
(`hold`/`release`, or `holding` around a block) with its message's
`in_progress`; one task of the command service sends it every `every_s`
for every delivery still held, oldest first. Before, every command started a
keep-alive task of its own and cancelled it at the end, twice (the action,
then the hand-over of its result):
- its end waited for the task group to see the child finish, two passes of
  an event loop busy with a thousand vehicles (p99 ~23 ms in a traced run
  of `bench mixed --vehicles 1000 --cmd-rate 10`);
- the cancelled task left ~35 objects of cyclic garbage (the
  CancelledError's traceback, frames, scopes). At 10 commands/s a young
  collection then freed ~9,000 at once and held the loop ~40 ms, every
  command in flight with it (docs/performance.md).
Holding a command is two dict operations and no task.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

import anyio

InProgress = Callable[[], Awaitable[object]]


class KeepAlives:
    """The commands in flight, in the order their next `in_progress` is due; `run()` sends them."""

    def __init__(self, every_s: float) -> None:
        if every_s <= 0:
            raise ValueError(f"every_s must be > 0, not {every_s}")
        self.every_s = every_s
        # token -> (monotonic time the next in_progress is due, how to send it). Every entry is due
        # `every_s` after it was added or last sent, so insertion order is due order.
        self._held: dict[int, tuple[float, InProgress]] = {}
        self._last_token = 0
        self._added = anyio.Event()
        self.sent = 0

    def __len__(self) -> int:
        return len(self._held)

    @contextmanager
    def holding(self, in_progress: InProgress) -> Iterator[None]:
        """Send `in_progress()` every `every_s` while the block runs (from `run`, never from here)."""
        token = self.hold(in_progress)
        try:
            yield
        finally:
            self.release(token)

    def hold(self, in_progress: InProgress) -> int:
        """Send `in_progress()` every `every_s` until `release(token)` (a lane holds a delivery across tasks)."""
        self._last_token += 1
        token = self._last_token
        self._held[token] = (time.monotonic() + self.every_s, in_progress)
        self._added.set()
        return token

    def release(self, token: int) -> None:
        self._held.pop(token, None)

    async def run(self) -> None:
        """Forever: sleep until the oldest entry is due, send its `in_progress`, put it last."""
        while True:
            if not self._held:
                await self._added.wait()
                self._added = anyio.Event()
                continue
            token, (due, in_progress) = next(iter(self._held.items()))
            wait_s = due - time.monotonic()
            if wait_s > 0:
                # Anything added meanwhile is due after this one; anything removed is skipped on waking.
                await anyio.sleep(wait_s)
                continue
            del self._held[token]
            self._held[token] = (time.monotonic() + self.every_s, in_progress)
            self.sent += 1
            await in_progress()
