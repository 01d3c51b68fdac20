"""State publishing below nats-py's per-message API: HPUB framed here, sampled acks on one inbox.

Per state sample, `nc.publish` with a header costs ~3.8 µs of CPU (subject
and header validation, header encoding, a flush future) and
`js.publish_async` several times that (a `wait_for` on a semaphore, a NUID
inbox, a future with callbacks, the JSON ack parsed into a PubAck). The
gateway publishes ~24 samples a vehicle-second, so the publisher frames
HPUB commands itself (~0.7 µs, docs/performance.md) and appends a tick's
worth to the client's write buffer at once; the bytes on the wire are what
`nc.publish` would send.

The sampled acks (every Nth sample, `state_ack_every`) carry a reply subject
on one wildcard inbox subscription (`StateAcks`): the ack's arrival gives the
receive-to-ack latency, an `"error"` in it or a no-responders status counts
as an error. An ack that never comes (a disconnect, a server that lost it)
expires after the publish timeout, so the in-flight bound cannot wedge.

nats-py's write buffer is private API, written through
`mavjet.contract.natsadapter` (`write_commands`, `write_now`): the publisher
asks `has_write_buffer` at connect, and without it (or on a nats-py version
the adapter was not verified against) falls back to `nc.publish` and
`js.publish_async`. `tests/gateway/test_publisher_raw.py` checks that
subscribers and the stream see the same messages either way.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from typing import Any

import structlog
from nats.aio.client import Client

from mavjet.contract import natsadapter

log = structlog.get_logger("mavjet.nats")


class RawPublish:
    """HPUB commands with one constant header, for nats-py's write buffer (`natsadapter.write_commands`)."""

    def __init__(self, headers: dict[str, str]) -> None:
        self.header = _header_block(headers)
        self._hlen = len(self.header)
        # Per subject, the command with everything but the lengths and the payload filled in, without and
        # with a reply subject: one %-format of two or three values a sample instead of five or six.
        self._templates: dict[str, tuple[bytes, bytes]] = {}

    def _template(self, subject: str) -> tuple[bytes, bytes]:
        if len(self._templates) > 100_000:
            self._templates.clear()
        subj = subject.encode().replace(b"%", b"%%")
        tail = b" %d %%d\r\n" % self._hlen + self.header.replace(b"%", b"%%") + b"%b\r\n"
        pair = self._templates[subject] = (b"HPUB " + subj + tail, b"HPUB " + subj + b" %b" + tail)
        return pair

    @staticmethod
    def frame_once(subject: str, reply: bytes, headers: dict[str, str], payload: bytes) -> bytes:
        """One HPUB command with its own headers (an event's `Nats-Msg-Id`), not from a template."""
        hdr = _header_block(headers)
        return b"HPUB %b %b %d %d\r\n%b%b\r\n" % (subject.encode(), reply, len(hdr), len(hdr) + len(payload),
                                                   hdr, payload)

    def frame(self, subject: str, payload: bytes, reply: bytes = b"") -> bytes:
        """One HPUB command: subject, [reply,] header length, total length, header, payload."""
        plain, replied = self._templates.get(subject) or self._template(subject)
        if reply:
            return replied % (reply, self._hlen + len(payload), payload)
        return plain % (self._hlen + len(payload), payload)


class DirectDelivery:
    """Stands in for a nats-py subscription's message queue: each message goes to `handler` at once.

    nats-py's read task parses a message into the subscription's asyncio.Queue
    and the subscription's own task takes it out one event-loop pass later: at
    2,000 vehicles, p50 5 ms and p99 73 ms of a state sample's receive-to-ack
    latency, and of a command result's wait for its ack. Here the handler
    runs in the read task itself, so it must be quick, must not block, and
    must not raise (an exception would end nats-py's read task): one that
    does is logged and the next message is handled all the same.
    `subscribe_direct` installs it; `tests/gateway/test_direct_delivery.py`
    holds it to nats-py's behaviour.
    """

    def __init__(self, handler: Callable[[Any], None]) -> None:
        self._handler = handler
        self.failures = 0

    def put_nowait(self, msg: Any) -> None:
        try:
            self._handler(msg)
        except Exception:
            self.failures += 1
            log.exception("ack_handler_failed")

    # What nats-py asks of the queue besides `put_nowait` (drain, unsubscribe, stats).
    def qsize(self) -> int:
        return 0

    def empty(self) -> bool:
        return True

    def task_done(self) -> None:
        return None

    async def join(self) -> None:
        return None


async def subscribe_direct(nc: Client, subject: str, handler: Callable[[Any], None]) -> bool:
    """Subscribe `handler` to `subject`, called in nats-py's read task (`DirectDelivery`).

    Falls back to an ordinary callback subscription when nats-py's
    subscription has no queue to stand in for (`natsadapter.replace_queue`);
    returns whether delivery is direct.
    """
    # No callback: no task of its own. No byte limit: nothing is queued, so nothing counts down.
    sub = await nc.subscribe(subject, pending_bytes_limit=0)
    if natsadapter.replace_queue(sub, DirectDelivery(handler)):
        return True
    await sub.unsubscribe()

    async def cb(msg: Any) -> None:
        handler(msg)

    await nc.subscribe(subject, cb=cb)
    return False


class _AckInbox:
    """Replies on one wildcard inbox: `<prefix>.<n>`, n counting up from 1."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._prefix_b = prefix.encode() + b"."
        self._cut = len(prefix) + 1
        self._next = 0

    @property
    def subject(self) -> str:
        return self.prefix + ".*"

    def _new_reply(self) -> tuple[int, bytes]:
        self._next += 1
        return self._next, self._prefix_b + str(self._next).encode()

    def _token(self, subject: str | bytes) -> int:
        """The number at the end of a reply subject; -1 (matches nothing) if it is not one."""
        try:
            return int(subject[self._cut:])
        except ValueError:
            return -1


class StateAcks(_AckInbox):
    """Sampled state publishes awaiting their JetStream ack on one wildcard inbox.

    `add(recv_ns, now_ns)` returns the reply subject for one publish;
    `on_msg` (delivered in nats-py's read task, `subscribe_direct`) settles it; `expire(now_ns)`
    gives up on acks older than `timeout_ns`, oldest first. `on_ack(recv_ns)`
    and `on_error(reason)` report the outcome.
    """

    def __init__(self, prefix: str, *, timeout_ns: int, on_ack: Callable[[int], None],
                 on_error: Callable[[str], None]) -> None:
        super().__init__(prefix)
        self.timeout_ns = timeout_ns
        self._on_ack = on_ack
        self._on_error = on_error
        self._pending: dict[int, tuple[int, int]] = {}  # token -> (receive time, send time), oldest first
        self.expired = 0

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, recv_ns: int, now_ns: int) -> bytes:
        token, reply = self._new_reply()
        self._pending[token] = (recv_ns, now_ns)
        return reply

    def expire(self, now_ns: int) -> None:
        pending = self._pending
        limit = now_ns - self.timeout_ns
        while pending:
            token = next(iter(pending))
            if pending[token][1] > limit:
                return
            del pending[token]
            self.expired += 1
            self._on_error("no ack within the publish timeout")

    def on_msg(self, msg: Any) -> None:
        entry = self._pending.pop(self._token(msg.subject), None)
        if entry is None:
            return  # expired already
        data = msg.data
        if not data:
            self._on_error(pub_ack_error(data, msg.headers) or "empty ack")
        elif b'"error"' in data:  # not json.loads: every Nth state sample, and a substring says enough
            self._on_error(data[:200].decode(errors="replace"))
        else:
            self._on_ack(entry[0])


class EventAcks(_AckInbox):
    """Direct event publishes (`Publisher.publish_event_now`) awaiting their JetStream ack on one wildcard inbox.

    `add()` returns a reply subject and the future its ack settles with the
    ack message; `discard(reply)` forgets one that was given up on.
    """

    def __init__(self, prefix: str) -> None:
        super().__init__(prefix)
        self._waiting: dict[int, asyncio.Future[Any]] = {}

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self) -> tuple[bytes, asyncio.Future[Any]]:
        token, reply = self._new_reply()
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[token] = fut
        return reply, fut

    def discard(self, reply: bytes) -> None:
        self._waiting.pop(self._token(reply), None)

    def on_msg(self, msg: Any) -> None:
        fut = self._waiting.pop(self._token(msg.subject), None)
        if fut is not None and not fut.done():
            fut.set_result(msg)


def _header_block(headers: dict[str, str]) -> bytes:
    """The NATS/1.0 header block of an HPUB command."""
    return ("NATS/1.0\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode()


def pub_ack_error(data: bytes, headers: Mapping[str, str] | None) -> str | None:
    """Why a JetStream publish ack (its body and headers) is not one; None: the stream stored the message."""
    if not data:
        status = (headers or {}).get("Status", "")
        return f"no responders (status {status})" if status == "503" else f"empty ack (status {status})"
    try:
        ack = json.loads(data)
    except ValueError:
        return f"not an ack: {data[:200]!r}"
    if not isinstance(ack, dict) or "error" in ack or "stream" not in ack:
        return f"refused: {data[:200].decode(errors='replace')}"
    return None
