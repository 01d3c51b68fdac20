"""Reading the twin back out of JetStream: current state and the event trail.

Both use ordered consumers with a callback (3-5x faster than fetch/next_msg,
which create a task per message) and stop when the consumer reports nothing
pending, so a snapshot read is bounded and never waits for new data.

`staleness()` is the one rule for "is this twin live" (docs/commands.md,
Staleness): pure, from the stored records and the reader's clock.

Who serves a vehicle (docs/ownership.md, "Presence"): `read_lease` (the
owner, by a direct get of its lease) and `read_presence` / `PresenceFeed`
(the standbys' records through a consumer created on their filter), each a
`GatewaySeen` whose `gone()` is the staleness rule of presence.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js import api as jsapi

from mavjet.contract import envelope
from mavjet.contract.events import EventType
from mavjet.contract.subjects import (
    LEASES_STREAM,
    event_filter,
    lease_key,
    lease_kv_subject,
    parse_subject,
    presence_filter,
    state_filter,
)
from mavjet.gateway.ownership.lease import LeaseTiming, decode_value
from mavjet.gateway.ownership.presence import decode_presence
from mavjet.ops.fmt import format_value

# A twin whose newest vehicle sample is older than this is stale (`--stale-after`).
STALE_AFTER_S = 5.0
# The gateway is gone when its liveness record (the `link` channel, published
# every period even for a silent vehicle) misses this many periods, and at
# least STALE_AFTER_S.
GATEWAY_MISSED_PERIODS = 3


@dataclass(frozen=True, slots=True)
class Record:
    subject: str
    vid: str
    kind: str  # channel or event type
    seq: int
    time: dt.datetime
    data: dict[str, Any]


def to_record(msg: Msg) -> Record | None:
    try:
        env = envelope.unpack(msg.data)
        _, vid, _, kind = parse_subject(msg.subject)
    except (envelope.EnvelopeError, ValueError):
        return None
    seq = msg.metadata.sequence.stream if msg.reply else 0
    return Record(msg.subject, vid, kind, seq, env.time, env.data)


async def read_until_caught_up(
    js: JetStreamContext, subject: str, config: jsapi.ConsumerConfig, on_record: Callable[[Record], None],
    *, timeout_s: float = 5.0,
) -> int:
    """Deliver every stored message matching `subject` (per `config`), then return the count."""
    done = asyncio.Event()
    count = 0

    async def cb(msg: Msg) -> None:
        nonlocal count
        rec = to_record(msg)
        if rec is not None:
            on_record(rec)
            count += 1
        if msg.metadata.num_pending == 0:
            done.set()

    try:
        info = await js.find_stream_name_by_subject(subject)
        si = await js.stream_info(info, subjects_filter=subject)
        if not si.state.messages or not (si.state.subjects or {}):
            return 0
    except Exception:
        return 0
    sub = await js.subscribe(subject, cb=cb, ordered_consumer=True, config=config)
    try:
        await caught_up(sub, done, timeout_s=timeout_s)
    finally:
        await sub.unsubscribe()
    return count


async def caught_up(sub: JetStreamContext.PushSubscription, done: asyncio.Event, *, timeout_s: float) -> None:
    """Wait until `done` (the callback saw `num_pending == 0`), or at once when there is nothing to deliver.

    A consumer whose range is empty (`--since` after the newest event, a vid
    with no events) never calls back, so `done` would only come from the
    timeout: its info, asked once, says so (nothing delivered, nothing
    pending) and the read ends there instead.
    """
    if done.is_set():
        return
    try:
        info = await sub.consumer_info()
        if not info.num_pending and not (info.delivered and info.delivered.consumer_seq):
            return
    except Exception:  # an ordered consumer being reset, a slow server: the bounded wait below still ends it
        pass
    with anyio.move_on_after(timeout_s):
        await done.wait()


async def current_state(js: JetStreamContext, env: str, vid: str = "*") -> dict[tuple[str, str], Record]:
    """The newest message of every state channel of every matching vehicle."""
    out: dict[tuple[str, str], Record] = {}

    def keep(r: Record) -> None:
        out[(r.vid, r.kind)] = r

    cfg = jsapi.ConsumerConfig(deliver_policy=jsapi.DeliverPolicy.LAST_PER_SUBJECT)
    await read_until_caught_up(js, state_filter(env, vid), cfg, keep)
    return out


async def events_since(
    js: JetStreamContext, env: str, *, vid: str = "*", since: dt.datetime | None = None, last: int | None = None
) -> list[Record]:
    out: list[Record] = []
    if since is not None:
        cfg = jsapi.ConsumerConfig(deliver_policy=jsapi.DeliverPolicy.BY_START_TIME, opt_start_time=since)
    else:
        cfg = jsapi.ConsumerConfig(deliver_policy=jsapi.DeliverPolicy.ALL)
    await read_until_caught_up(js, event_filter(env, vid), cfg, out.append, timeout_s=10.0)
    if last is not None:
        out = out[-last:]
    return out


def age_s(t: dt.datetime, now: dt.datetime) -> float:
    """Seconds from a record's time (the gateway's receive time) to the reader's `now`."""
    return (now - t).total_seconds()


@dataclass(frozen=True, slots=True, kw_only=True)
class Staleness:
    """Whether a twin is live, and why not.

    `age_s`: of the newest vehicle sample (every channel but `link`, which the
    gateway writes itself); `gateway_age_s`: of the gateway's liveness record
    (`link`); `reason` is None when fresh, else `gateway gone`, `link lost`
    (or another link state), `no data for N s`, `no data`, `no gateway record`
    or `clock skew`.
    """

    stale: bool
    age_s: float | None
    gateway_age_s: float | None
    reason: str | None


def staleness(channels: Mapping[str, Record], now: dt.datetime, stale_after_s: float = STALE_AFTER_S) -> Staleness:
    """The staleness of one vehicle from its newest record per channel (`channel -> Record`)."""
    data = [r.time for ch, r in channels.items() if ch != "link"]
    age = age_s(max(data), now) if data else None
    link = channels.get("link")
    gw_age = age_s(link.time, now) if link is not None else None
    reason: str | None = None
    if link is None:
        reason = "no gateway record"
    else:
        period = link.data.get("period_s")
        limit = stale_after_s
        if isinstance(period, int | float) and not isinstance(period, bool):
            limit = max(limit, GATEWAY_MISSED_PERIODS * float(period))
        state = link.data.get("state")
        if gw_age is not None and gw_age > limit:
            reason = "gateway gone"
        elif state != "up":
            reason = f"link {state or 'unknown'}"
    if reason is None:
        if age is None:
            reason = "no data"
        elif age > stale_after_s:
            reason = f"no data for {age:.0f} s"
        elif age < -stale_after_s or (gw_age is not None and gw_age < -stale_after_s):
            # A time far ahead of the reader cannot show liveness: it would
            # look fresh until the reader's clock caught up.
            reason = "clock skew"
    return Staleness(stale=reason is not None, age_s=age, gateway_age_s=gw_age, reason=reason)


def format_event(r: Record) -> str:
    return f"{event_time(r)} {r.vid:<10} {r.kind:<20} {event_summary(r)}".rstrip()


def event_time(r: Record) -> str:
    return r.time.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def event_summary(r: Record) -> str:
    """What happened, then the vehicle's snapshot in brackets: format_event's last column."""
    d = dict(r.data)
    snap = []
    for key, fmt in (("mode", "{}"), ("alt_m", "{:.1f}m"), ("battery_pct", "{:.0f}%")):
        v = d.pop(key, None)
        if v is not None:
            snap.append(fmt.format(v))
    for k in ("armed", "lat_deg", "lon_deg", "alt_msl_m", "flavour"):
        d.pop(k, None)
    if r.kind == EventType.CMD_RESULT:
        # The interesting part first: what, how it ended, how long it took.
        head = f"{d.pop('name', '?')} {d.pop('result', '?')} in {d.pop('latency_ms', 0) or 0:.0f} ms"
        d["cmd_id"] = str(d.get("cmd_id", ""))[:12]
        d = {"": head, **d}
    detail = " ".join(f"{k}={format_value(k, v)}" if k else str(v) for k, v in d.items() if v not in (None, ""))
    return f"{detail} [{' '.join(snap)}]"


# -- who serves a vehicle: the owner (its lease) and the standbys (their presence records) -------------

_DELETED = ("DEL", "PURGE")
_LEASE_READ_S = 2.0


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewaySeen:
    """One gateway of a vehicle as the read commands show it (docs/ownership.md, "Presence").

    The owner comes from the vehicle's lease, a standby from its presence record.
    `stored` is the server's timestamp of the record (the lease's last renew);
    `gone_after_s` the staleness rule: the lease's TTL for an owner (a standby
    takes over then), `GATEWAY_MISSED_PERIODS` of its period for a standby.
    """

    vid: str
    role: str  # "owner" or "standby"
    holder: str
    instance: str
    host: str
    pid: int
    since: str  # the writer's wall clock, shown as given
    stored: dt.datetime | None
    gone_after_s: float
    link: str | None = None  # a standby's link to the vehicle (the owner's is in its link record)
    active_link: str | None = None
    owner: str | None = None  # the owner a standby sees

    def age_s(self, now: dt.datetime) -> float | None:
        return None if self.stored is None else age_s(self.stored, now)

    def gone(self, now: dt.datetime) -> bool:
        age = self.age_s(now)
        return age is not None and age > self.gone_after_s

    def to_json(self, now: dt.datetime) -> dict[str, Any]:
        age = self.age_s(now)
        doc: dict[str, Any] = {"holder": self.holder, "instance": self.instance, "host": self.host, "pid": self.pid,
                               "since": self.since, "age_s": None if age is None else round(age, 3),
                               "gone": self.gone(now)}
        if self.role == "standby":
            doc.update(link=self.link, active_link=self.active_link, owner=self.owner)
        return doc


def _stored_time(msg: Msg) -> dt.datetime | None:
    try:
        return msg.metadata.timestamp
    except Exception:  # not a JetStream delivery
        return None


def _standby(vid: str, data: bytes, stored: dt.datetime | None) -> GatewaySeen | None:
    p = decode_presence(data)
    if p is None:
        return None
    return GatewaySeen(vid=vid, role="standby", holder=p.holder, instance=p.instance, host=p.host, pid=p.pid,
                       since=p.since, stored=stored, gone_after_s=GATEWAY_MISSED_PERIODS * p.period_s, link=p.link,
                       active_link=p.active_link, owner=p.owner)


def _presence_vid(subject: str) -> tuple[str, str] | None:
    """(vid, gateway id) of `$KV.TWIN_LEASES.fleet.<env>.veh.<vid>.gw.<id>`."""
    parts = subject.split(".")
    if len(parts) != 8 or parts[6] != "gw":
        return None
    return parts[5], parts[7]


async def read_lease(js: JetStreamContext, env: str, vid: str) -> GatewaySeen | None:
    """The vehicle's owner as its lease names it; None when nobody holds it (or it cannot be read)."""
    try:
        with anyio.fail_after(_LEASE_READ_S):
            msg = await js.get_msg(LEASES_STREAM, subject=lease_kv_subject(lease_key(env, vid)), direct=True)
    except Exception:  # no bucket (before `mavjet provision`), no lease, no permission: no owner to show
        return None
    if (msg.headers or {}).get("KV-Operation") in _DELETED or not msg.data:
        return None
    v = decode_value(msg.data)
    if v is None:
        return None
    return GatewaySeen(vid=vid, role="owner", holder=v.holder, instance=v.instance, host=v.host, pid=v.pid,
                       since=v.since, stored=msg.time, gone_after_s=LeaseTiming().ttl_s)


class PresenceFeed:
    """The standbys' presence records through one filtered consumer: what is stored, then (live) what comes.

    A named consumer created on the filtered subject (`CONSUMER.CREATE.KV_TWIN_LEASES.<name>.<filter>`),
    so a viewer's credential can be allowed the presence records and not the commands in flight
    beside them (ops/auth.py). `on_seen(vid, gateway id, GatewaySeen | None)`: None when a record was deleted.
    """

    def __init__(self, nc: Client, env: str, vid: str = "*") -> None:
        self.nc, self.env, self.vid = nc, env, vid
        self.sub: Subscription | None = None
        self.name = f"presence_{secrets.token_hex(8)}"
        self.pending = -1  # what was stored when the consumer was created (-1: not known yet)
        self.delivered = 0
        self._caught_up = asyncio.Event()

    async def start(self, on_seen: Callable[[str, str, GatewaySeen | None], None]) -> None:
        async def cb(msg: Msg) -> None:
            ids = _presence_vid(msg.subject)
            if ids is not None:
                deleted = (msg.headers or {}).get("KV-Operation") in _DELETED or not msg.data
                on_seen(*ids, None if deleted else _standby(ids[0], msg.data, _stored_time(msg)))
            self.delivered += 1
            # Deliveries may come before the create's answer: caught up only once the total is known.
            if 0 <= self.pending <= self.delivered:
                self._caught_up.set()

        js = self.nc.jetstream()
        inbox = self.nc.new_inbox()
        self.sub = await self.nc.subscribe(inbox, cb=cb)
        config = jsapi.ConsumerConfig(name=self.name, filter_subject=presence_filter(self.env, self.vid),
                                      deliver_subject=inbox, ack_policy=jsapi.AckPolicy.NONE,
                                      deliver_policy=jsapi.DeliverPolicy.LAST_PER_SUBJECT,
                                      inactive_threshold=10.0, mem_storage=True, num_replicas=1)
        try:
            info = await js.add_consumer(LEASES_STREAM, config=config)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.stop()
            raise
        # Stored at creation: still pending, plus any already delivered when the answer was made.
        already = (info.delivered.consumer_seq or 0) if info.delivered is not None else 0
        self.pending = int(info.num_pending or 0) + int(already)
        if self.pending <= self.delivered:
            self._caught_up.set()

    async def caught_up(self, timeout_s: float) -> None:
        with anyio.move_on_after(timeout_s):
            await self._caught_up.wait()

    async def stop(self) -> None:
        sub, self.sub = self.sub, None
        if sub is None:
            return
        try:
            await sub.unsubscribe()
            with anyio.fail_after(1.0):
                await self.nc.jetstream().delete_consumer(LEASES_STREAM, self.name)
        except Exception:  # the connection may be gone: the consumer's inactive threshold (10 s) removes it
            pass


async def read_presence(nc: Client, env: str, vid: str = "*", *, timeout_s: float = 3.0) -> list[GatewaySeen] | None:
    """Every standby's presence record (of `vid`, or of the env's vehicles); None when they cannot be read."""
    found: dict[tuple[str, str], GatewaySeen] = {}

    def keep(v: str, gw: str, seen: GatewaySeen | None) -> None:
        if seen is None:
            found.pop((v, gw), None)
        else:
            found[(v, gw)] = seen

    feed = PresenceFeed(nc, env, vid)
    try:
        with anyio.fail_after(timeout_s):
            await feed.start(keep)
        await feed.caught_up(timeout_s)
    except Exception:  # no bucket (before `mavjet provision`), an old credential: standbys not shown
        return None
    finally:
        await feed.stop()
    return sorted(found.values(), key=lambda s: (s.vid, s.holder))
