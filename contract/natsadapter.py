"""Every use of nats-py's private API in mavjet, behind one version guard.

mavjet reaches below nats-py's public API where a measurement said the
public way costs too much (docs/performance.md, docs/analytics.md) or is
wrong (the PING order). Each such use reads names nats-py may rename in any
release, so they all live in this one file: a nats-py upgrade is audited
here, ruff's SLF rule is on for every other file (pyproject.toml), and
tests/test_natsadapter.py fails on a private nats-py name used elsewhere.

The uses, each with the public way it falls back to:
- the client (`new_client`): `OrderedFlushClient` queues `flush()`'s PING
  behind the commands still buffered; else `FlushTwiceClient`, whose
  `flush()` first pushes the buffer out with a flush of its own.
- the write buffer (`has_write_buffer`, `write_commands`, `write_now`,
  `stream_transport`): the gateway's state and command-result HPUBs go to
  the socket in one write; else `nc.publish` and `js.publish_async`.
- direct delivery (`replace_queue`): a subscription's messages handed over
  in nats-py's read task; else a callback subscription.
- one pull request at a time (`PullInternals`): the command consumer's pull
  without a TimeoutError per idle request; else `fetch`.
- the ordered consumer's short cut (`install_ordered_short_cut`) and a
  faster header parser (`install_header_parser`) for the analytics reader;
  else nats-py's own parsing.
- the connection of a JetStream context (`client_of`): no public way to it
  exists, so it is read on any version (see there).

The guard: `VERIFIED` holds the nats-py versions this file was read against
and tested with. The installed version is checked once, at import; on any
other version every use above takes its public way (slower, the same
messages on the wire), said once in the log. To admit a new version: read
nats-py's diff for the names used here, run the tests that hold this module
to nats-py (tests/test_natsadapter.py lists them), then add it to `VERIFIED`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

import structlog
from nats.aio.client import DEFAULT_FLUSH_TIMEOUT, PING_PROTO, Client
from nats.aio.client import __version__ as _installed_version
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

log = structlog.get_logger("mavjet.nats")

#: The nats-py versions whose private names this module was checked against, each with its tests passing.
VERIFIED: Final = frozenset({"2.16.0"})
NATS_PY_VERSION: Final = str(_installed_version)


@dataclass(slots=True)
class _Guard:
    version: str
    internals: bool
    said: bool = False


_guard = _Guard(NATS_PY_VERSION, NATS_PY_VERSION in VERIFIED)


def check_version(version: str = NATS_PY_VERSION) -> bool:
    """Decide, for nats-py `version`, whether the private API is used; returns the decision.

    Run once at import with the installed version. A test passes another
    one to take the public ways against a real server, then calls it again
    without an argument. Connections and subscriptions made before keep the
    way they took.
    """
    _guard.version, _guard.internals, _guard.said = version, version in VERIFIED, False
    return _guard.internals


def internals() -> bool:
    """Whether the private API may be used; says once in the log when the version rules it out."""
    if not _guard.internals and not _guard.said:
        _guard.said = True
        log.warning("nats_py_unverified", version=_guard.version, verified=sorted(VERIFIED),
                    effect="nats-py's public API throughout: correct, slower (contract/natsadapter.py)")
    return _guard.internals


# -- the client ---------------------------------------------------------------


class OrderedFlushClient(Client):
    """nats-py's Client whose PING (`flush()`, keep-alive) queues behind the commands already buffered.

    nats-py 2.16 writes PING straight to the socket while SUB and PUB wait in
    its write buffer for the flusher task, so the PONG that ends `flush()`
    can come back before the server has seen a SUB made just before it. A
    subscriber on one connection that flushes and then lets another
    connection publish would miss those messages (tests caught it: 0 of 23
    states seen, while the stream had acked them). nats.py2 fixed the same
    bug in 2017 by sending the PING through the flusher; this does the same.
    `tests/gateway/test_natsconn_flush.py` checks the order.
    """

    async def _send_ping(self, future: asyncio.Future[Any] | None = None) -> None:
        if future is None:
            future = asyncio.get_running_loop().create_future()
        self._pongs.append(future)
        self._pending.append(PING_PROTO)
        self._pending_data_size += len(PING_PROTO)
        await self._flush_pending()


class FlushTwiceClient(Client):
    """The same order through the public API, for an unverified nats-py: buffered commands go first.

    With commands buffered, a first `flush()` has the flusher write them (it
    is woken before the PONG can be read), so the second one's PING follows
    them. Costs a round trip more, and only then.
    """

    async def flush(self, timeout: int = DEFAULT_FLUSH_TIMEOUT) -> None:  # noqa: ASYNC109 (nats-py's signature)
        if self.pending_data_size:
            await super().flush(timeout)
        await super().flush(timeout)


def new_client() -> Client:
    """An unconnected client for `natsconn.open_client`, the one place mavjet makes one."""
    return OrderedFlushClient() if internals() else FlushTwiceClient()


# -- the write buffer ----------------------------------------------------------

_WRITE_BUFFER = ("_pending", "_pending_data_size", "_flush_pending", "_flush_queue", "_max_pending_size")


def has_write_buffer(nc: Client) -> bool:
    """Whether `write_commands` and `write_now` may be used on `nc` (asked once, at connect)."""
    return internals() and all(hasattr(nc, a) for a in _WRITE_BUFFER)


async def write_commands(nc: Client, cmds: list[bytes]) -> None:
    """Append framed commands to the client's buffer and send it: straight to the socket while it keeps up.

    Waking nats-py's flusher, as `nc.publish` does, put one more pass of an
    event loop busy with thousands of vehicles between a tick and the
    socket: at 2,000 vehicles p50 7 ms, p99 77 ms of a sample's
    receive-to-ack latency (docs/performance.md). While the socket takes
    everything (the transport buffers nothing), the buffer goes out here,
    whole and in order. When it does not, the flusher writes and waits for
    the socket to drain, as before: that is the back-pressure.
    """
    data = b"".join(cmds)
    nc._pending.append(data)
    nc._pending_data_size += len(data)
    nc.stats["out_msgs"] += len(cmds)
    transport = nc._transport
    if transport is not None and _socket_keeps_up(nc):
        _send_pending(nc, transport)
    elif nc._max_pending_size > 0 and nc._pending_data_size > nc._max_pending_size:
        await nc._flush_pending(force_flush=True)
    elif nc._flush_queue is not None and nc._flush_queue.empty():
        await nc._flush_pending()


def write_now(nc: Client, cmd: bytes) -> bool:
    """Append one command to the client's buffer and hand the whole buffer to the socket now.

    For a command result (`Publisher.publish_event_now`). Unlike
    `write_commands` it does not wait for the socket to keep up: behind a
    backlog the transport buffers the result, after everything queued before
    it, so nothing is overtaken. False, with nothing written, without a
    transport (the caller publishes another way).
    """
    transport = getattr(nc, "_transport", None)
    if transport is None:
        return False
    nc._pending.append(cmd)
    nc.stats["out_msgs"] += 1
    _send_pending(nc, transport)
    return True


def _send_pending(nc: Client, transport: Any) -> None:
    """Hand the client's whole buffer to its transport, in order, and empty it (what the flusher does, minus the wait)."""
    pending = nc._pending
    nc._pending, nc._pending_data_size = [], 0
    transport.writelines(pending)


def _socket_keeps_up(nc: Client) -> bool:
    """The client is connected over a plain stream whose transport holds nothing back."""
    if not nc.is_connected:
        return False
    writer = getattr(nc._transport, "_io_writer", None)  # None: a websocket transport, or none yet
    if writer is None:
        return False
    transport = writer.transport
    return not transport.is_closing() and transport.get_write_buffer_size() == 0


def stream_transport(nc: Client) -> asyncio.Transport | None:
    """The asyncio transport under the client's socket (to size its reads); None on a websocket or the public way."""
    if not internals():
        return None
    writer = getattr(getattr(nc, "_transport", None), "_io_writer", None)
    return None if writer is None else writer.transport


# -- direct delivery -------------------------------------------------------------


def replace_queue(sub: Subscription, queue: Any) -> bool:
    """Put `queue` (a `put_nowait` that handles the message) in place of the subscription's asyncio.Queue.

    nats-py's read task puts each message there; it also asks the queue for
    `qsize`, `empty`, `task_done` and `join` (drain, unsubscribe, stats).
    False, changing nothing, where the subscription has no such queue.
    """
    if not internals() or not isinstance(getattr(sub, "_pending_queue", None), asyncio.Queue):
        return False
    sub._pending_queue = queue
    return True


# -- one pull request at a time -----------------------------------------------------


class PullInternals:
    """A pull subscription's request subject, inbox and message queue (`mavjet.gateway.commands.pull`).

    `of(psub)` is None where nats-py lacks them (or the version is not
    verified): the caller then uses `fetch`.
    """

    __slots__ = ("_psub", "queue")

    def __init__(self, psub: Any) -> None:
        self._psub = psub
        self.queue: asyncio.Queue[Msg] = psub._sub._pending_queue

    @staticmethod
    def present(psub: Any) -> bool:
        """Whether this nats-py pull subscription has what `PullInternals` reads (whatever the version)."""
        inner = getattr(psub, "_sub", None)
        return (isinstance(getattr(inner, "_pending_queue", None), asyncio.Queue)
                and isinstance(getattr(psub, "_nms", None), str) and isinstance(getattr(psub, "_deliver", None), str))

    @classmethod
    def of(cls, psub: Any) -> PullInternals | None:
        return cls(psub) if internals() and cls.present(psub) else None

    async def request(self, body: bytes) -> None:
        """Send one pull request; the server answers on the subscription's inbox."""
        psub = self._psub
        await psub._nc.publish(psub._nms, body, psub._deliver)

    def taken(self, msg: Msg) -> Msg:
        """Account for a message taken off the queue, as nats-py's `next_msg` does."""
        inner = self._psub._sub
        inner._pending_size -= len(msg.data)
        self.queue.task_done()
        return msg


# -- a JetStream context's connection --------------------------------------------------------


def client_of(js: JetStreamContext) -> Client:
    """The connection a JetStream context was made from (its inbox prefix is the credential's).

    nats-py offers no public way to it, so there is nothing slower to fall
    back to and it is read on any version; tests/ops/test_logstore.py reads
    a log through it.
    """
    nc: Client = js._nc
    return nc


# -- JetStream domains: KV writes across a leaf node ------------------------------------

DEFAULT_API_PREFIX = "$JS.API"


def api_prefix(js: JetStreamContext) -> str:
    """A context's JetStream API prefix: `$JS.API`, or `$JS.<domain>.API` for `nc.jetstream(domain=...)`."""
    prefix = getattr(js, "_prefix", DEFAULT_API_PREFIX)
    return prefix if isinstance(prefix, str) else DEFAULT_API_PREFIX


def put_subject(js: JetStreamContext, subject: str) -> str:
    """Where a KV write (`$KV.<bucket>.<key>`) goes from this context.

    A leaf node with its own JetStream domain does not carry `$KV.` subjects to the hub: nats.go
    therefore writes across a domain on `$JS.<domain>.API.$KV.<bucket>.<key>` (its `putPre`), which
    the hub maps to the bucket. nats-py's KeyValue does not (measured with nats-server 2.15: "no
    response from stream" on the plain subject, stored on the prefixed one).
    """
    prefix = api_prefix(js)
    return subject if prefix == DEFAULT_API_PREFIX else f"{prefix}.{subject}"


class _PrefixedPuts:
    """A JetStream context for a KeyValue: its `$KV.` publishes go where `put_subject` says; the rest as is."""

    def __init__(self, js: JetStreamContext) -> None:
        self._js = js

    async def publish(self, subject: str, *args: Any, **kwargs: Any) -> Any:
        return await self._js.publish(put_subject(self._js, subject) if subject.startswith("$KV.") else subject,
                                      *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._js, name)


def key_value_across_domain(kv: KeyValue, js: JetStreamContext) -> KeyValue:
    """`kv` as bound by `js.key_value(...)`, writing across `js`'s domain like nats.go (see `put_subject`)."""
    if api_prefix(js) != DEFAULT_API_PREFIX:
        kv._js = _PrefixedPuts(js)  # type: ignore[assignment]
    return kv


# -- the analytics reader: headers ---------------------------------------------------


def install_header_parser(nc: Client, parse: Callable[[bytes], dict[str, str]]) -> bool:
    """Parse this connection's message headers with `parse` (nats-py's `_parse_header_lines`' result, faster)."""
    if not internals() or not hasattr(nc, "_parse_header_lines"):
        return False
    # an instance attribute shadows the static method for this connection only
    setattr(nc, "_parse_header_lines", parse)  # noqa: B010
    return True


# -- the analytics reader: the ordered consumer's short cut -----------------------------------
#
# For every message nats-py matches the protocol line with a regular
# expression, awaits a coroutine, parses the headers into a dict, builds a
# `Msg`, queues it and wakes the subscription's task to run the callback:
# more CPU than decoding the event itself, and none of it needed by a reader
# that takes the stream sequence and pending count from the reply subject
# and never reads a header (profiled in a Spark worker: nats-py was ~60% of
# a read, the decoding ~40%).
#
# `install_ordered_short_cut` hands each stored message of the subscription
# whose callback is `on_msg` straight to `on_data(stream seq, pending, subject, payload)`:
# - complete `HMSG` frames in the read buffer are cut out in one loop;
# - the ordered consumer's bookkeeping nats-py does for a data message (the
#   delivery-sequence check, flow-control tracking, activity) is repeated;
# - everything else goes through nats-py unchanged, one frame at a time:
#   heartbeats and flow-control requests (a status line in the header),
#   a delivery-sequence gap (nats-py restarts the consumer), other
#   subscriptions, and any other protocol operation.

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


def install_ordered_short_cut(nc: Client, on_msg: Callable[[Msg], Awaitable[None]], on_data: DataSink) -> bool:
    """Route `on_msg`'s stored messages to `on_data` on this connection. Call before subscribing.

    False, changing nothing, where the client lacks what this relies on: the
    reader then runs on the callback.
    """
    if not internals():
        return False
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
