"""Sending commands through TWIN_CMD and waiting for their `cmd_result`.

Used by `mavjet cmd`, the demo's sortie, the command benchmark and the tests.
One core subscription on `fleet.<env>.veh.*.evt.cmd_result` serves every
command in flight (results are matched by `cmd_id`), opened *before* the
first publish so a fast result cannot be missed. At a central cluster over
leaf hubs, events reach the centre only through its TWIN_EVENTS' sources
(docs/deploy.md, "Central cluster over leaf hubs"), so there the client is
made with `results_from_stream=True` and reads `cmd_result`s from that stream
(an ordered consumer from now on) instead of a core subscription. A command is `(vid, cmd_id)`:
results are matched on both, and a command is published with `Nats-Msg-Id`
`<vid>:<id>`, so publishing it twice within the stream's duplicate window
queues it once, and the second publish raises `DuplicateCommand` (the
stream's PubAck says `duplicate`) instead of leaving the caller waiting for a
result that was already produced.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy

from mavjet.contract import envelope
from mavjet.contract.commands import (
    CmdResult,
    check_command_id,
    command_msg_id,
    encode_command,
    validate_params,
)
from mavjet.contract.errors import MavjetError
from mavjet.contract.events import EventType
from mavjet.contract.subjects import (
    EVENTS_STREAM,
    cmd_subject,
    event_filter,
)

RECENT_RESULTS = 10_000
ANY_VEHICLE = "*"  # wait for a cmd_id whatever vehicle answers (tests publishing raw bodies)


class ResultTimeout(MavjetError):
    """No cmd_result arrived for a command within the wait."""

    def __init__(self, cmd_id: str, timeout_s: float) -> None:
        super().__init__(f"no cmd_result for {cmd_id} within {timeout_s:g} s")
        self.cmd_id = cmd_id
        self.timeout_s = timeout_s


class DuplicateCommand(MavjetError):
    """The stream dropped the publish: this (vid, cmd_id) was already queued within its duplicate window."""

    def __init__(self, vid: str, cmd_id: str, seq: int) -> None:
        super().__init__(f"command {cmd_id} for {vid} was already queued (TWIN_CMD seq {seq}); "
                         "the stream dropped this copy as a duplicate, so no new result will come")
        self.vid = vid
        self.cmd_id = cmd_id
        self.seq = seq


@dataclass(frozen=True, slots=True, kw_only=True)
class Result:
    """A `cmd_result` event as seen by the issuer."""

    vid: str
    cmd_id: str
    name: str
    result: str  # a CmdResult value (kept a str: a newer gateway may send kinds this client does not know)
    mav_result: int | None
    detail: str
    attempts: int
    latency_ms: float  # as the gateway measured it (issued -> result)
    seen_ns: int  # when this client received the event
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def accepted(self) -> bool:
        return self.result == CmdResult.ACCEPTED


def new_command_id() -> str:
    return uuid.uuid4().hex


class CommandClient:
    """Publish commands and await their results. Use as `async with CommandClient(nc, env) as cc:`."""

    def __init__(self, nc: Client, env: str, *, issuer: str = "mavjet-cli", publish_timeout_s: float = 5.0,
                 results_from_stream: bool = False) -> None:
        self.nc = nc
        self.js = nc.jetstream(timeout=publish_timeout_s)
        self.env = env
        self.issuer = issuer
        self.results_from_stream = results_from_stream
        self._sub: Subscription | JetStreamContext.PushSubscription | None = None
        # Keyed (vid, cmd_id); a waiter's vid may be ANY_VEHICLE.
        self._waiters: dict[tuple[str, str], asyncio.Future[Result]] = {}
        self._recent: OrderedDict[tuple[str, str], Result] = OrderedDict()
        self.published_ns: dict[tuple[str, str], int] = {}

    async def __aenter__(self) -> CommandClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        if self._sub is None:
            subject = event_filter(self.env, "*", EventType.CMD_RESULT)
            if self.results_from_stream:
                # A leaf hub's events are not forwarded live to the centre (its leaf remote denies them):
                # results arrive through the centre's TWIN_EVENTS, once each, also after a cut.
                self._sub = await self.js.subscribe(subject, stream=EVENTS_STREAM, cb=self._on_result, ordered_consumer=True,
                                                    config=ConsumerConfig(deliver_policy=DeliverPolicy.NEW))
            else:
                self._sub = await self.nc.subscribe(subject, cb=self._on_result)
            await self.nc.flush()

    async def close(self) -> None:
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception:  # the connection may already be closed; nothing left to undo
                pass
            self._sub = None
        for fut in self._waiters.values():
            fut.cancel()
        self._waiters.clear()

    async def _on_result(self, msg: Msg) -> None:
        try:
            env = envelope.unpack(msg.data)
        except envelope.EnvelopeError:
            return
        d = env.data
        cmd_id = d.get("cmd_id")
        if not isinstance(cmd_id, str):
            return
        res = Result(
            vid=env.vid, cmd_id=cmd_id, name=str(d.get("name", "")), result=str(d.get("result", "")),
            mav_result=d.get("mav_result"), detail=str(d.get("detail", "")), attempts=int(d.get("attempts") or 0),
            latency_ms=float(d.get("latency_ms") or 0.0), seen_ns=time.time_ns(), data=d,
        )  # fmt: skip
        self._recent[(res.vid, cmd_id)] = res
        self._recent[(ANY_VEHICLE, cmd_id)] = res
        while len(self._recent) > RECENT_RESULTS:
            self._recent.popitem(last=False)
        for key in ((res.vid, cmd_id), (ANY_VEHICLE, cmd_id)):
            fut = self._waiters.pop(key, None)
            if fut is not None and not fut.done():
                fut.set_result(res)

    # -- publishing --------------------------------------------------------
    async def publish(
        self,
        vid: str,
        name: str,
        params: Mapping[str, Any] | None = None,
        *,
        cmd_id: str | None = None,
        deadline_s: float | None = None,
        validate: bool = True,
    ) -> str:
        """Queue a command; returns its id. `validate=False` sends params unchecked (tests of the gateway).

        `deadline_s` (from now) becomes the body's `deadline`; without it the
        gateway applies its `default_deadline_s` from `issued`. Raises
        DuplicateCommand if the stream already holds this (vid, cmd_id).
        """
        params = dict(params or {})
        cmd_id = cmd_id or new_command_id()
        if validate:
            validate_params(name, params)
            check_command_id(cmd_id)
        now = time.time_ns()
        deadline_ns = None if deadline_s is None else now + int(deadline_s * 1e9)
        payload = encode_command(cmd_id, params, issued_ns=now, deadline_ns=deadline_ns, issuer=self.issuer)
        await self.publish_raw(vid, name, payload, msg_id=cmd_id)
        return cmd_id

    async def publish_raw(self, vid: str, name: str, payload: bytes, *, msg_id: str) -> None:
        """Publish an already-encoded body (also bad ones, for tests) as command `msg_id` of `vid`.

        The header is `Nats-Msg-Id: <vid>:<msg_id>`. Raises DuplicateCommand
        when the stream's PubAck says it dropped the message as a duplicate,
        unless this is this client publishing it again before its result came
        (a retry after a lost PubAck: the command is queued, its result will come).
        """
        await self.start()
        key = (vid, msg_id)
        # This client retrying its own publish (the first PubAck was lost) is not an error while the result is owed.
        own_retry = key in self.published_ns and key not in self._recent
        self.published_ns[key] = time.time_ns()
        ack = await self.js.publish(
            cmd_subject(self.env, vid, name), payload,
            headers={"Nats-Msg-Id": command_msg_id(vid, msg_id), "Content-Type": envelope.CONTENT_TYPE},
        )  # fmt: skip
        if ack.duplicate and not own_retry:
            raise DuplicateCommand(vid, msg_id, int(ack.seq or 0))

    def expect(self, cmd_id: str, vid: str = ANY_VEHICLE) -> asyncio.Future[Result]:
        """A future for the result of (`vid`, `cmd_id`) (already resolved if it has arrived)."""
        key = (vid, cmd_id)
        fut: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        done = self._recent.get(key)
        if done is not None:
            fut.set_result(done)
        else:
            self._waiters[key] = fut
        return fut

    async def wait(self, cmd_id: str, timeout_s: float, *, vid: str = ANY_VEHICLE) -> Result:
        fut = self._waiters.get((vid, cmd_id)) or self.expect(cmd_id, vid)
        try:
            with anyio.fail_after(timeout_s):
                return await asyncio.shield(fut)
        except TimeoutError:
            raise ResultTimeout(cmd_id, timeout_s) from None

    async def call(
        self,
        vid: str,
        name: str,
        params: Mapping[str, Any] | None = None,
        *,
        deadline_s: float | None = None,
        timeout_s: float = 60.0,
        cmd_id: str | None = None,
    ) -> Result:
        """Publish and wait for the result."""
        cmd_id = cmd_id or new_command_id()
        self.expect(cmd_id, vid)
        try:
            await self.publish(vid, name, params, cmd_id=cmd_id, deadline_s=deadline_s)
        except BaseException:
            self._waiters.pop((vid, cmd_id), None)
            raise
        return await self.wait(cmd_id, timeout_s, vid=vid)

    def result(self, cmd_id: str, vid: str = ANY_VEHICLE) -> Result | None:
        return self._recent.get((vid, cmd_id))
