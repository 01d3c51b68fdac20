"""The range reader's short cut through nats-py for the messages of its ordered consumer.

For every message nats-py matches the protocol line with a regular
expression, awaits a coroutine, parses the headers into a dict, builds a
`Msg`, queues it and wakes the subscription's task to run the callback:
more CPU than decoding the event itself, and none of it needed by a reader
that takes the stream sequence and pending count from the reply subject
and never reads a header (profiled in a Spark worker: nats-py was ~60% of
a read, the decoding ~40%).

`install` hands each stored message of the subscription whose callback is
`on_msg` straight to `on_data(stream seq, pending, subject, payload)`:
- complete `HMSG` frames in the read buffer are cut out in one loop;
- the ordered consumer's bookkeeping nats-py does for a data message (the
  delivery-sequence check, flow-control tracking, activity) is repeated;
- everything else goes through nats-py unchanged, one frame at a time:
  heartbeats and flow-control requests (a status line in the header),
  a delivery-sequence gap (nats-py restarts the consumer), other
  subscriptions, and any other protocol operation.
Nothing changes when the client lacks the internals this relies on
(nats-py 2.x); the reader then runs on the callback as before.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg

ACK_PREFIX = b"$JS.ACK."
_HMSG = b"HMSG "
_MSG = b"MSG "
_CRLF = b"\r\n"
_STATUS_AT = len(b"NATS/1.0")  # a space there: a status line (heartbeat, flow control), not a stored message
_SPACE = 32

DataSink = Callable[[int, int, bytes, bytes], None]


class _Deliver:
    """Decides per message; returns False (changing nothing) for what nats-py must handle."""

    __slots__ = ("mine", "on_data", "on_msg", "stats", "subs")

    def __init__(self, subs: dict[int, Any], stats: dict[str, int], on_msg: Any, on_data: DataSink) -> None:
        self.subs = subs
        self.stats = stats
        self.on_msg = on_msg
        self.on_data = on_data
        self.mine: Any = None  # the subscription, found on its first message (its sid changes on a reset)

    def __call__(self, sid: int, subject: bytes, reply: bytes, data: bytes, status: bool) -> bool:
        sub = self.subs.get(sid)
        if sub is None or status or not reply.startswith(ACK_PREFIX):
            return False
        if sub is not self.mine:
            jsi = getattr(sub, "_jsi", None)
            if getattr(sub, "_cb", None) != self.on_msg or jsi is None or not getattr(jsi, "_ordered", False):
                return False
            self.mine = sub
        jsi = sub._jsi
        t = reply.split(b".")
        try:
            if len(t) == 9:  # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>
                sseq, dseq, pending = int(t[5]), int(t[6]), int(t[8])
            elif len(t) >= 11:  # with domain and account hash
                sseq, dseq, pending = int(t[7]), int(t[8]), int(t[10])
            else:
                return False
        except ValueError:
            return False
        if dseq != jsi._dseq:
            return False  # a gap: nats-py restarts the ordered consumer after the last sequence seen
        stats = self.stats
        stats["in_msgs"] += 1
        stats["in_bytes"] += len(data)
        sub._received += 1
        jsi._active = True
        jsi._dseq = dseq + 1
        jsi._sseq = sseq
        jsi._fciseq += 1  # what track_sequences() does: flow control counts delivered data messages
        jsi._cmeta = reply.decode()
        self.on_data(sseq, pending, subject, data)
        return True


def install(nc: Client, on_msg: Callable[[Msg], Awaitable[None]], on_data: DataSink) -> bool:
    """Route `on_msg`'s stored messages to `on_data` on this connection. Call before subscribing."""
    orig_process = getattr(nc, "_process_msg", None)
    subs = getattr(nc, "_subs", None)
    stats = getattr(nc, "stats", None)
    if orig_process is None or not isinstance(subs, dict) or not isinstance(stats, dict):
        return False
    deliver = _Deliver(subs, stats, on_msg, on_data)

    async def process_msg(sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        status = headers is not None and len(headers) > _STATUS_AT and headers[_STATUS_AT] == _SPACE
        if not deliver(sid, subject, reply, data, status):
            await orig_process(sid, subject, reply, data, headers)

    setattr(nc, "_process_msg", process_msg)  # noqa: B010
    _install_parser(getattr(nc, "_ps", None), deliver)
    return True


def _install_parser(ps: Any, deliver: _Deliver) -> None:
    try:
        from nats.protocol.parser import AWAITING_CONTROL_LINE, AWAITING_MSG_PAYLOAD
    except ImportError:
        return
    if ps is None or not isinstance(getattr(ps, "buf", None), bytearray) or not hasattr(ps, "state"):
        return
    orig_parse = ps.parse

    async def handoff(buf: bytearray, end: int) -> bool:
        """Let nats-py parse buf[:end] (one whole frame) by itself; False if it replaced the buffer."""
        tail = bytes(buf[end:])
        del buf[end:]
        await orig_parse()
        if ps.buf is not buf:  # reset by a reconnect meanwhile: what was buffered is void
            return False
        took_it = not buf
        buf.extend(tail)
        if not took_it:  # nats-py did not read it as one frame: the rest is its own business
            await orig_parse()
        return took_it

    async def parse(data: bytes = b"") -> None:
        buf: bytearray = ps.buf
        buf.extend(data)
        while buf:
            if ps.state == AWAITING_MSG_PAYLOAD:  # a frame nats-py started: it finishes it
                end = ps.needed + len(_CRLF)
                if len(buf) < end or not await handoff(buf, end):
                    return
                continue
            if ps.state != AWAITING_CONTROL_LINE:
                await orig_parse()
                return
            n, pos = len(buf), 0
            while buf.startswith(_HMSG, pos):
                eol = buf.find(_CRLF, pos)
                if eol < 0:
                    break
                args = bytes(buf[pos + len(_HMSG) : eol]).split()
                if len(args) != 5 or not (args[1].isdigit() and args[3].isdigit() and args[4].isdigit()):
                    break
                hlen, start = int(args[3]), eol + len(_CRLF)
                end = start + int(args[4])
                if end + len(_CRLF) > n:
                    break
                status = hlen > _STATUS_AT and buf[start + _STATUS_AT] == _SPACE
                if not deliver(int(args[1]), args[0], args[2], bytes(buf[start + hlen : end]), status):
                    break
                pos = end + len(_CRLF)
            if pos:
                del buf[:pos]
                continue
            # the first frame is not one of ours (or not complete yet)
            eol = buf.find(_CRLF)
            if eol < 0:
                return  # wait for the rest of the line
            line = bytes(buf[:eol])
            end = eol + len(_CRLF)
            if line.startswith((_HMSG, _MSG)):
                size = line.split()[-1]
                if not size.isdigit():
                    await orig_parse()  # nats-py says what is wrong with it
                    return
                end += int(size) + len(_CRLF)
            if len(buf) < end or not await handoff(buf, end):
                return

    setattr(ps, "parse", parse)  # noqa: B010
