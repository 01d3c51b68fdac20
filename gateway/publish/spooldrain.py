"""Publishing a spool to JetStream: oldest first, each with its `Nats-Msg-Id`, removed only once acked.

One drain for every spool the gateway keeps (the events', gateway/publish/publisher.py;
the flight recorder's, gateway/stores/recorder.py), so both keep the same promises:

- order: a batch of `DRAIN_BATCH` entries is published in row order and its
  acks are awaited in that order; only the acked prefix is removed. An entry
  whose ack fails (no stream, an error) does not stop the rest of its batch,
  already sent, from being stored: those go out again after it and are
  dropped as duplicates, so the stream holds them before it;
- at least once: an entry leaves the spool only after its ack, and a failure
  (an error ack, or no ack within `timeout_s`) leaves it spooled for the next
  drain;
- no duplicates downstream: a republished entry carries the same
  `Nats-Msg-Id`, which the stream's duplicate window drops.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import anyio
from nats.js import JetStreamContext

from mavjet.contract.envelope import CONTENT_TYPE
from mavjet.gateway.publish.spool import Spool, SpoolEntry

DRAIN_BATCH = 256


async def drain_spool(spool: Spool, js: JetStreamContext, *, timeout_s: float,
                      on_acked: Callable[[int, float], None],
                      on_error: Callable[[Exception], None] | None = None,
                      on_sent: Callable[[list[SpoolEntry]], None] | None = None) -> int:
    """Publish `spool` oldest first until it is empty; returns how many were acked (and removed).

    `on_acked(n, elapsed_s)` follows each removal of `n` acked entries
    (`elapsed_s`: from the batch's last publish to its last ack awaited).
    `on_error(exc)` sees a failed or late ack before it is raised; the acked
    prefix of that batch is removed all the same. `on_sent(batch)` follows
    each batch's publishes, before its acks are awaited.
    """
    total = 0
    while True:
        batch = await spool.peek(DRAIN_BATCH)
        if not batch:
            return total
        futs: list[asyncio.Future[Any]] = []
        for e in batch:
            hdrs = {"Content-Type": CONTENT_TYPE, "Nats-Msg-Id": e.msg_id}
            futs.append(await js.publish_async(e.subject, e.payload, headers=hdrs))
        if on_sent is not None:
            on_sent(batch)
        last_ok = None
        t0 = time.monotonic()
        try:
            with anyio.fail_after(timeout_s):
                for e, fut in zip(batch, futs, strict=True):
                    await fut
                    last_ok = e.rowid
        except Exception as exc:
            if on_error is not None:
                on_error(exc)
            raise
        finally:
            # nats-py never times an ack out itself: a future left waiting holds one of the
            # context's `publish_async_max_pending` slots for good (cancelling a done one is a no-op).
            for f in futs:
                f.cancel()
            if last_ok is not None:
                n = sum(1 for e in batch if e.rowid <= last_ok)
                elapsed_s = time.monotonic() - t0
                await spool.remove_upto(last_ok)
                total += n
                on_acked(n, elapsed_s)
