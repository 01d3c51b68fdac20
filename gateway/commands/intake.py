"""TWIN_CMD consumers: pull the commands of the vehicles this gateway owns and hand each to its lane.

Two shapes (`[commands] consumer`, docs/commands.md):

- **gateway** (a hub): one durable pull consumer per gateway process,
  `gwx_<holder>`, whose `filter_subjects` are the `cmd.>` subjects of the
  vehicles this gateway owns *now*. MaxAckPending is the gateway's budget
  (`commands.max_ack_pending`); the per-vehicle rules (one at a time, in
  order, retries) are the lanes' (`gateway/commands/lane.py`). As ownership
  changes, the filter is updated in place (one API call, changes of 50 ms
  taken together), and the pull subscription stays bound. One consumer
  instead of one per vehicle: the server's memory, its create time and its
  per-message filter matching no longer grow with the fleet
  (docs/capacity.md).
- **vehicle** (a companion, or `consumer = "vehicle"`): the durable
  `gw_<vid>` per vehicle with MaxAckPending 1, shared by every gateway of
  that vehicle; only the owner pulls. A companion's credential can name it
  exactly (docs/security.md).

On a work-queue stream two consumers' filters may not overlap (the server
refuses with 10100). A vehicle whose previous owner died still sits in the
dead gateway's consumer: the new owner, holding the lease, takes the
vehicle's subject out of that consumer (or deletes it when nothing is left)
and adds it to its own. A command the old consumer had handed out and not
settled is delivered again by the new one (a work queue keeps a message
until it is acked), and the shared in-flight record decides what happens to
it (docs/ownership.md). A gateway consumer left by a dead process is
removed by the server after `INACTIVE_S` without pull requests; a clean stop
deletes its own.

nats-py pull subscriptions can go stale across a server restart (the fetch
request goes nowhere). The intake therefore re-binds after every reconnect,
and every `STALE_CHECK_S` of idle requests, or at once after a request the
server never ended (`gateway/commands/pull.py`), asks the server for the
consumer: missing → re-created; commands pending but none delivered → the
subscription is stale, re-bound.

JetStream API calls go through one limiter for the whole gateway
(`API_CONCURRENCY` at a time): a thousand vehicle consumers created at once
while the server stores their first state would time out and be retried,
adding to the server's queue.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Mapping
from typing import Any

import anyio
import structlog
from anyio.abc import TaskGroup
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, ConsumerInfo, DeliverPolicy
from nats.js.errors import BadRequestError, NotFoundError

from mavjet.contract.subjects import CMD_STREAM, cmd_filter
from mavjet.drivers.mavlink.backoff import Backoff
from mavjet.gateway.commands.delivery import HAND_BACK_DELAY_S
from mavjet.gateway.commands.lane import VehicleLane
from mavjet.gateway.commands.pull import PullOne
from mavjet.gateway.config import CommandsConfig
from mavjet.gateway.services import ServiceContext

log = structlog.get_logger("mavjet.commands")

API_CONCURRENCY = 8  # JetStream API calls of the intakes in flight at once, gateway-wide
# How often an idle intake asks the server about its consumer. A backstop: a reconnect re-binds at once, and a
# command that waits on a stale subscription ends `expired` at its deadline, never late.
STALE_CHECK_S = 30.0
CHANGE_SETTLE_S = 0.05  # ownership changes this close together make one filter update
FENCE_LOOK_S = 1.0  # a fenced vehicle leaves the filter within this (its lane hands back meanwhile)
IDLE_LOOK_S = 5.0  # an intake that owns nothing looks again this often, besides every ownership change
INACTIVE_S = 120.0  # the server deletes a gateway consumer no process has pulled from this long
MAX_BATCH = 256  # commands one pull request of a gateway consumer asks for
MAX_FILTERS = 500  # vehicles per gateway consumer (see `gateway_intakes`)
REFUSALS_AT_ONCE = 8
OVERLAP = 10100  # JSConsumerWQConsumerNotUniqueErr: "filtered consumer not unique on workqueue stream"
_PAGE = 256


def gateway_intakes(ctx: ServiceContext, lanes: Mapping[str, VehicleLane], *, base_name: str,
                    api: anyio.CapacityLimiter, max_ack_pending: int) -> list[Intake]:
    """A gateway's own consumers: one per `MAX_FILTERS` vehicles (sorted), each named `<base_name>_<i>`.

    The server's work to create or update a consumer grows with the square of its filters (nats-server
    2.15: 1,000 filters 0.16 s, 4,000 2.1 s, 10,000 past a 10 s API timeout), and an ownership change
    rewrites the whole list: groups of 500 keep both at tens of milliseconds. The budget is split with
    them, at least one `max_queued_per_vehicle` lane's worth each.
    """
    vids = sorted(lanes)
    groups = [tuple(vids[i:i + MAX_FILTERS]) for i in range(0, len(vids), MAX_FILTERS)]
    share = max(ctx.cfg.commands.max_queued_per_vehicle + 1, -(-max_ack_pending // max(1, len(groups))))
    return [Intake(ctx, lanes, name=f"{base_name}_{i}", vids=group, max_ack_pending=share, inactive_s=INACTIVE_S,
                   api=api) for i, group in enumerate(groups)]


class _Rebind(Exception):
    """The pull subscription must be bound again (reconnect, missing or stale consumer, nothing owned)."""


def filters_of(config: ConsumerConfig) -> frozenset[str]:
    if config.filter_subjects:
        return frozenset(config.filter_subjects)
    return frozenset([config.filter_subject]) if config.filter_subject else frozenset()


def consumer_config(name: str, env: str, vids: frozenset[str], cfg: CommandsConfig, *, max_ack_pending: int,
                    inactive_s: float | None) -> ConsumerConfig:
    """One consumer's settings; with one vehicle its filter is `filter_subject`, so a create can name it."""
    subjects = sorted(cmd_filter(env, vid) for vid in vids)
    single = len(subjects) == 1
    return ConsumerConfig(
        name=name,
        durable_name=name,
        description=(f"mavjet gateway commands for {next(iter(vids))}" if single and inactive_s is None
                     else f"mavjet gateway commands ({len(vids)} vehicles)"),
        filter_subject=subjects[0] if single else None,
        filter_subjects=None if single else subjects,
        deliver_policy=DeliverPolicy.ALL,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=cfg.ack_wait_s,
        max_deliver=cfg.max_deliver,
        backoff=list(cfg.backoff_s) or None,
        max_ack_pending=max_ack_pending,
        inactive_threshold=inactive_s,
    )


def drifted(have: ConsumerConfig, want: ConsumerConfig) -> list[str]:
    out = []
    if filters_of(have) != filters_of(want):
        out.append("filter_subjects")
    if have.max_deliver != want.max_deliver:
        out.append("max_deliver")
    if have.max_ack_pending != want.max_ack_pending:
        out.append("max_ack_pending")
    if [round(b, 3) for b in (have.backoff or [])] != [round(b, 3) for b in (want.backoff or [])]:
        out.append("backoff")
    if not want.backoff and round(have.ack_wait or 0, 3) != round(want.ack_wait or 0, 3):
        out.append("ack_wait")
    return out


class Intake:
    """One TWIN_CMD consumer and its pull loop, feeding the lanes of the vehicles it carries."""

    def __init__(self, ctx: ServiceContext, lanes: Mapping[str, VehicleLane], *, name: str, vids: tuple[str, ...],
                 max_ack_pending: int, inactive_s: float | None, api: anyio.CapacityLimiter) -> None:
        self.ctx = ctx
        self.cfg = ctx.cfg.commands
        self.env = ctx.cfg.env
        self.lanes = lanes
        self.name = name
        self.vids = vids
        self.max_ack_pending = max_ack_pending
        self.batch = min(MAX_BATCH, max_ack_pending)
        self.inactive_s = inactive_s  # None: a vehicle's own consumer, shared and kept
        self.api = api
        self.bound: frozenset[str] = frozenset()  # the vehicles in the consumer's filter now
        self.binds = 0
        self.updates = 0  # filter changes made in place
        self.stale_rebinds = 0
        self.taken_over = 0  # vehicles' subjects taken out of another gateway's consumer
        self.draining = False
        self._changed = anyio.Event()
        self._refusals = anyio.CapacityLimiter(REFUSALS_AT_ONCE)

    def owned(self) -> frozenset[str]:
        if self.draining:
            return frozenset()
        may_act = self.ctx.ownership.may_act
        return frozenset(vid for vid in self.vids if may_act(vid))

    def stop_pulling(self) -> None:
        self.draining = True
        self._signal()

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._follow_ownership, name=f"gateway.commands.{self.name}.ownership")
            await self._bind_forever(tg)

    async def _bind_forever(self, tg: TaskGroup) -> None:
        backoff = Backoff(initial_s=0.2, max_s=5.0)
        while True:
            changed = self._changed
            want = self.owned()
            if not want:  # a standby, or stopping: nothing to pull until this gateway owns a vehicle
                with anyio.move_on_after(IDLE_LOOK_S):  # also a change made before this intake listened
                    await changed.wait()
                continue
            sub: Any = None
            try:
                nc, js = await self.ctx.jetstream()
                async with self.api:
                    await self._ensure(js, want)
                    sub = await js.pull_subscribe_bind(durable=self.name, stream=CMD_STREAM)
                self._bound(want)
                backoff.reset()
                await self._serve(nc, js, sub, tg)
            except _Rebind as exc:
                log.info("command_consumer_rebind", consumer=self.name, reason=str(exc))
            except Exception as exc:  # nats-py raises a wide range; the loop must outlive all of it
                delay = backoff.next_delay_s()
                log.warning("command_consumer_error", consumer=self.name, error=f"{type(exc).__name__}: {exc}",
                            retry_in_s=round(delay, 2))
                await anyio.sleep(delay)
            finally:
                self.bound = frozenset()
                if sub is not None:
                    with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
                        try:
                            await sub.unsubscribe()
                        except Exception:  # the connection may be gone; nothing to clean up then
                            pass

    def _bound(self, want: frozenset[str]) -> None:
        for vid in want - self.bound:
            self.lanes[vid].binds += 1
        self.bound = want
        self.binds += 1

    def _signal(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def _follow_ownership(self) -> None:
        """Tell the pull loop and the lanes of every ownership change (quick: flags and events only)."""
        ownership = self.ctx.ownership
        while True:
            await ownership.changed()
            for vid in self.bound:
                if not ownership.may_act(vid):
                    self.lanes[vid].kick()  # hands back what waits at once
            self._signal()

    async def _serve(self, nc: Client, js: JetStreamContext, sub: Any, tg: TaskGroup) -> None:
        """Pull until a rebind is due; meanwhile keep the consumer's filter on the vehicles owned."""
        why: list[str] = []
        async with anyio.create_task_group() as serving:
            async def pull() -> None:
                try:
                    await self._pull(nc, js, sub, tg)
                except _Rebind as exc:
                    why.append(str(exc))
                serving.cancel_scope.cancel()

            serving.start_soon(pull, name=f"gateway.commands.{self.name}.pull")
            why.append(await self._update_filters(js))
            serving.cancel_scope.cancel()
        raise _Rebind(why[0])

    async def _update_filters(self, js: JetStreamContext) -> str:
        """Follow ownership with in-place filter updates; returns when the consumer must be let go."""
        while True:
            changed = self._changed
            want = self.owned()
            if not want:
                return "stopping: no new commands" if self.draining else "owns none of its vehicles now"
            if want == self.bound:
                # A fence comes by the clock, not by a change: a gateway consumer looks again every
                # FENCE_LOOK_S. A vehicle's own consumer needs not: its pull loop asks before every request.
                with anyio.move_on_after(FENCE_LOOK_S if self.inactive_s is not None else math.inf):
                    await changed.wait()
                    await anyio.sleep(CHANGE_SETTLE_S)
                continue
            if self.inactive_s is None:  # a vehicle's own consumer: its filter never changes
                return "ownership changed"
            async with self.api:
                await self._ensure(js, want, known=True)
            self.updates += 1
            log.info("command_consumer_filter", consumer=self.name, vehicles=len(want),
                     added=len(want - self.bound), removed=len(self.bound - want))
            self._bound(want)

    async def _pull(self, nc: Client, js: JetStreamContext, sub: Any, tg: TaskGroup) -> None:
        reconnects = nc.stats["reconnects"]
        timeout = self.cfg.fetch_timeout_s
        # The first check at a random point of the period, so consumers bound together do not ask together.
        next_check = time.monotonic() + random.uniform(0.5, 1.0) * max(timeout, STALE_CHECK_S)
        pull = PullOne(sub, batch=self.batch)
        may_act = self.ctx.ownership.may_act
        while True:
            if nc.stats["reconnects"] != reconnects:
                raise _Rebind("NATS reconnected")
            if not nc.is_connected:
                await anyio.sleep(0.1)
                continue
            if not any(map(may_act, self.bound)):  # fenced by the clock: no pull until the filter follows
                raise _Rebind("owns none of its vehicles now")
            msg = await pull.next(timeout)
            if msg is None:
                # A request the server never ended is a sign of a stale subscription: check at once.
                if not pull.answered or time.monotonic() >= next_check:
                    next_check = time.monotonic() + max(timeout, STALE_CHECK_S)
                    await self._check_stale(js)
                continue
            self._route(msg, tg)

    def _route(self, msg: Any, tg: TaskGroup) -> None:
        parts = msg.subject.split(".", 5)
        lane = self.lanes.get(parts[3]) if len(parts) == 6 else None
        if lane is None:  # not a subject of ours (a filter changed under a request): the owner's
            tg.start_soon(_nak, msg)
            return
        full = lane.offer(msg)
        if full is not None:
            tg.start_soon(self._refuse, lane, full)

    async def _refuse(self, lane: VehicleLane, held: Any) -> None:
        async with self._refusals:
            await lane.refuse(held)

    async def _check_stale(self, js: JetStreamContext) -> None:
        try:
            async with self.api:
                info = await js.consumer_info(CMD_STREAM, self.name, timeout=self.cfg.fetch_timeout_s)
        except NotFoundError:
            raise _Rebind("consumer missing (server lost it): re-creating") from None
        if (info.num_pending or 0) > 0 and not info.num_ack_pending and not info.num_waiting:
            self.stale_rebinds += 1
            raise _Rebind(f"stale pull subscription: {info.num_pending} commands pending, none delivered")

    # -- the consumer ------------------------------------------------------
    async def _ensure(self, js: JetStreamContext, vids: frozenset[str], *, known: bool = False) -> ConsumerInfo:
        """Create the consumer, or update it if its settings drifted (`known`: it exists, update at once)."""
        want = consumer_config(self.name, self.env, vids, self.cfg, max_ack_pending=self.max_ack_pending,
                               inactive_s=self.inactive_s)
        if not known:
            try:
                info: ConsumerInfo = await js.consumer_info(CMD_STREAM, self.name)
            except NotFoundError:
                log.info("command_consumer_create", consumer=self.name, vehicles=len(vids))
            else:
                drift = drifted(info.config, want)
                if not drift:
                    return info
                log.info("command_consumer_update", consumer=self.name, fields=drift)
        try:
            created: ConsumerInfo = await js.add_consumer(CMD_STREAM, config=want)
        except BadRequestError as exc:
            if exc.err_code != OVERLAP:
                raise
            await self._take_over(js, filters_of(want))
            created = await js.add_consumer(CMD_STREAM, config=want)
        return created

    async def _take_over(self, js: JetStreamContext, ours: frozenset[str]) -> None:
        """Take the subjects of vehicles this gateway owns out of other consumers (see module docstring)."""
        offset, found = 0, False
        while True:
            page = await js.consumers_info(CMD_STREAM, offset=offset)
            for info in page:
                theirs = filters_of(info.config)
                moved = theirs & ours
                if info.name == self.name or not moved:
                    continue
                found = True
                rest = theirs - moved
                log.warning("command_consumer_takeover", consumer=self.name, previous=info.name,
                            vehicles=sorted(s.split(".")[3] for s in moved)[:20], moved=len(moved), left=len(rest))
                if not rest:
                    await js.delete_consumer(CMD_STREAM, info.name)
                else:
                    cfg = info.config
                    single = len(rest) == 1
                    cfg.filter_subject = next(iter(rest)) if single else None
                    cfg.filter_subjects = None if single else sorted(rest)
                    await js.add_consumer(CMD_STREAM, config=cfg)
                self.taken_over += len(moved)
            if len(page) < _PAGE:
                break
            offset += len(page)
        if not found:
            raise RuntimeError(f"TWIN_CMD refuses {self.name}'s filter as overlapping, and no other consumer "
                               "names these vehicles' subjects exactly: look for a wildcard consumer "
                               "(`nats consumer ls TWIN_CMD`)")

    async def close(self) -> None:
        """Delete a gateway consumer at a clean stop (best effort): the next owner need not take it over."""
        if self.inactive_s is None:
            return
        js = self.ctx.nats.js
        if js is None:
            return
        with anyio.CancelScope(shield=True), anyio.move_on_after(2.0):
            try:
                await js.delete_consumer(CMD_STREAM, self.name)
                log.info("command_consumer_deleted", consumer=self.name)
            except Exception as exc:  # gone already, or NATS is: the server removes it after INACTIVE_S
                log.info("command_consumer_delete_failed", consumer=self.name, error=f"{type(exc).__name__}: {exc}")


async def _nak(msg: Any) -> None:
    try:
        await msg.nak(delay=HAND_BACK_DELAY_S)
    except Exception as exc:  # NATS down: redelivered after its ack timer anyway
        log.warning("command_ack_failed", error=f"{type(exc).__name__}: {exc}")
