"""The chunked-transfer tests' rig (TWIN_BLOBS, TWIN_LOGS): a wire spy, a cut link, a damaged chunk.

What crosses the wire is counted by a second connection subscribed to the
chunk subjects, independently of the client's own figures.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from mavjet.contract.natsconn import open_client
from mavjet.gateway.stores.chunks import Progress

CHUNK = 4096


class Cut(Exception):
    """The test's stand-in for a link that drops in the middle of a transfer."""


class Wire:
    """Counts the chunk messages and bytes published on the spied subjects (those containing `only`, if given)."""

    def __init__(self, only: str | None = None) -> None:
        self.only = only
        self.msgs = 0
        self.bytes = 0

    async def cb(self, msg: Msg) -> None:
        if self.only is None or self.only in msg.subject:
            self.msgs += 1
            self.bytes += len(msg.data)


@asynccontextmanager
async def wire_spy(url: str, subject: str, *, only: str | None = None) -> AsyncIterator[Wire]:
    """A `Wire` on its own connection, subscribed to `subject` (and flushed) before it is yielded."""
    spy = await open_client(url, connect_timeout=2)
    w = Wire(only)
    await spy.subscribe(subject, cb=w.cb)
    await spy.flush()
    try:
        yield w
    finally:
        await spy.close()


async def settle(nc: Client) -> None:
    """What `nc` published has reached the server, and the spy has had time to count it."""
    await nc.flush()
    await asyncio.sleep(0.2)


def cut_after(chunks: int, chunk_bytes: int = CHUNK) -> Progress:
    """A progress callback that cuts the transfer once `chunks` chunks are done (never after the last one)."""
    def progress(done_bytes: int, total_bytes: int) -> None:
        if chunks * chunk_bytes <= done_bytes < total_bytes:
            raise Cut
    return progress


async def corrupt_chunk(js: JetStreamContext, stream: str, subject: str, *, chunks: int, index: int) -> None:
    """Rewrite the `chunks` chunks stored on `subject` with one byte of chunk `index` flipped.

    As a damaged disk would leave them: the headers are the uploader's, less
    the ones the rewrite would trip on (expected sequence, duplicate id).
    """
    stored = []
    seq = 1
    for _ in range(chunks):
        m = await js.get_msg(stream, seq=seq, subject=subject, next=True)
        stored.append((m.data or b"", dict(m.headers or {})))
        seq = (m.seq or 0) + 1
    await js.purge_stream(stream, subject=subject)
    for i, (body, headers) in enumerate(stored):
        if i == index:
            body = body[:10] + bytes([body[10] ^ 0xFF]) + body[11:]
        headers.pop("Nats-Expected-Last-Subject-Sequence", None)
        headers.pop("Nats-Msg-Id", None)
        await js.publish(subject, body, headers=headers)
