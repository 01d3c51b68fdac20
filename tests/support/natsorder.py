"""The ordering `flush()` must give: a subscription flushed on one connection sees the next publish on another."""

from __future__ import annotations

import anyio
from nats.aio.client import Client
from nats.aio.msg import Msg


async def ordered_deliveries(watcher: Client, publisher: Client, *, rounds: int, prefix: str) -> int:
    """Each round: subscribe to a fresh subject on `watcher`, flush, publish on `publisher`;
    how many of the rounds' publishes arrived (all of them, when flush orders the SUB first)."""
    seen = 0
    for i in range(rounds):
        got = anyio.Event()

        async def on(_: Msg, got: anyio.Event = got) -> None:
            got.set()

        sub = await watcher.subscribe(f"{prefix}.{i}", cb=on)
        await watcher.flush()
        await publisher.publish(f"{prefix}.{i}", b"x")
        await publisher.flush()
        with anyio.move_on_after(5):
            await got.wait()
        seen += got.is_set()
        await sub.unsubscribe()
    return seen
