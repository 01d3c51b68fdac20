"""One answer, for every command that names a vehicle, to three questions asked before anything is done.

1. Is the env provisioned? A stream or bucket the command needs is missing:
   `NotProvisioned`, one line naming `mavjet provision --env ENV` (never a
   NotFoundError traceback, never a silent empty answer).
2. Is the vehicle known? Known means something of it is stored: a state
   sample, a shadow document, its TWIN_CMD consumer `gw_<vid>` (a gateway
   created it when it started serving the vehicle) or an event. None of them:
   `UnknownVehicle`, one line; commands that can queue work for a vehicle not
   yet seen (`cmd`, `shadow set`) take `--force`.
3. Is its gateway alive? `gone` is `mavjet fleet`'s "stale: gateway gone"
   (the gateway's liveness record, `link`, missed its periods: the one rule in
   `mavjet.ops.read.staleness`). Commands that need the vehicle to answer
   refuse then (`VehicleGone`); the ones that queue say so with the deadline.

Every failure is a MavjetError, so `run_cli` prints it as one line and exits 2.
Also here: `connect(args, name)`, the operator commands' connection, which
fails at once when every server refuses the connection instead of retrying
until the connect deadline.
"""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import nats.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NotFoundError

from mavjet.contract import natsconn
from mavjet.contract.errors import MavjetError
from mavjet.contract.subjects import (
    BLOBS_BUCKET,
    CMD_STREAM,
    EVENTS_STREAM,
    LOGS_STREAM,
    SHADOW_BUCKET,
    STATE_STREAM,
    check_token,
    cmd_filter,
    command_consumer,
    event_filter,
    log_records_filter,
    shadow_key,
    state_filter,
)

if TYPE_CHECKING:  # read.py imports the MAVLink dialect (fmt): `provision` and `synth` connect without it
    from mavjet.ops.read import Record, Staleness

SHADOW_DOCS = ("meta", "config", "desired", "reported")
GONE = "gateway gone"  # mavjet.ops.read.staleness's reasons
NO_RECORD = "no gateway record"
STALE_AFTER_S = 5.0  # as read.STALE_AFTER_S (read.py is imported lazily, see below)


class NotProvisioned(MavjetError):
    def __init__(self, env: str, missing: str) -> None:
        super().__init__(f"env {env!r} is not provisioned on this server ({missing} missing): "
                         f"run `mavjet provision --env {env}` (add --size small on a laptop)")
        self.env = env
        self.missing = missing


class UnknownVehicle(MavjetError):
    def __init__(self, env: str, vid: str, *, forceable: str = "") -> None:
        hint = f", or --force to {forceable}" if forceable else ""
        super().__init__(f"no gateway has registered vehicle {vid} in env {env!r} (no state, shadow, TWIN_CMD "
                         f"consumer or events): check the id with `mavjet fleet`{hint}")
        self.env = env
        self.vid = vid


class VehicleGone(MavjetError):
    """Nothing serves the vehicle (its gateway is gone, or it does not serve what the command needs)."""


# What a command needs, by the name it is known as in messages: (kind, name, subject to find it by).
_STREAMS = {STATE_STREAM: state_filter, EVENTS_STREAM: event_filter, CMD_STREAM: cmd_filter,
            LOGS_STREAM: log_records_filter}


async def require_env(js: JetStreamContext, env: str, needs: Iterable[str]) -> None:
    """Raise NotProvisioned unless every stream/bucket in `needs` exists for `env`.

    A stream is found by the env's subjects (`fleet.<env>...`), so a server
    provisioned for another env counts as not provisioned for this one.
    """
    check_token("env", env)
    for name in needs:
        subject_of = _STREAMS.get(name)
        try:
            if subject_of is not None:
                await js.find_stream_name_by_subject(subject_of(env))
            elif name == SHADOW_BUCKET:
                await js.key_value(SHADOW_BUCKET)
            elif name == BLOBS_BUCKET:
                await js.object_store(BLOBS_BUCKET)
            else:
                raise ValueError(name)
        except (NotFoundError, BucketNotFoundError):
            raise NotProvisioned(env, name) from None


@dataclass(frozen=True, slots=True, kw_only=True)
class Vehicle:
    """A vehicle as the stores know it."""

    vid: str
    env: str
    known: bool
    state: dict[str, Record]  # newest record per state channel
    fresh: Staleness | None  # None without any state record

    @property
    def gone(self) -> bool:
        """Its gateway stopped publishing its liveness record (`mavjet fleet`: stale: gateway gone).

        Also a vehicle whose samples are old and for which no liveness record
        is stored at all: nothing shows that any gateway serves it.
        """
        f = self.fresh
        if f is None:
            return False
        return f.reason == GONE or (f.reason == NO_RECORD and f.age_s is not None and f.age_s > STALE_AFTER_S)

    def gone_text(self) -> str:
        f = self.fresh
        if f is not None and f.gateway_age_s is not None:
            since = f" (its last liveness record is {f.gateway_age_s:.0f} s old)"
        elif f is not None and f.age_s is not None:
            since = f" (no liveness record; its newest sample is {f.age_s:.0f} s old)"
        else:
            since = ""
        return f"{self.vid}'s gateway is gone{since}; `mavjet fleet` shows it stale"


async def vehicle(nc: Client, env: str, vid: str, *, needs: Iterable[str] = (STATE_STREAM,),
                  force: str = "", allow_unknown: bool = False) -> Vehicle:
    """Resolve `vid` in `env`: raise NotProvisioned or UnknownVehicle, else return what is known.

    `force` names what `--force` would do (shown in the UnknownVehicle line);
    `allow_unknown` (the `--force` given) returns an unknown vehicle instead of raising.
    """
    from mavjet.ops.read import current_state, staleness

    check_token("vid", vid)
    js = nc.jetstream()
    await require_env(js, env, needs)
    try:
        records = await current_state(js, env, vid)
    except NotFoundError:
        records = {}
    state = {ch: r for (_, ch), r in records.items()}
    known = bool(state) or await _stored_anywhere(js, env, vid)
    if not known and not allow_unknown:
        raise UnknownVehicle(env, vid, forceable=force)
    fresh = staleness(state, dt.datetime.now(dt.UTC)) if state else None
    return Vehicle(vid=vid, env=env, known=known, state=state, fresh=fresh)


def require_served(v: Vehicle, *, why: str) -> None:
    """Raise VehicleGone when the vehicle's gateway is gone: `why` says what would have happened."""
    if v.gone:
        raise VehicleGone(f"{v.gone_text()}: {why}")


async def _stored_anywhere(js: JetStreamContext, env: str, vid: str) -> bool:
    """Its TWIN_CMD consumer, a shadow document or an event (state was looked at first).

    A lookup that fails otherwise than "not found" (no permission for that
    API under some credentials, a slow server) cannot tell: the vehicle counts
    as known, and the command's own request says what is wrong.
    """
    try:
        return await _lookups(js, env, vid)
    except nats.errors.Error as exc:
        return not isinstance(exc, NotFoundError | BucketNotFoundError)


async def _lookups(js: JetStreamContext, env: str, vid: str) -> bool:
    try:
        await js.consumer_info(CMD_STREAM, command_consumer(vid))
        return True
    except NotFoundError:
        pass
    try:
        kv = await js.key_value(SHADOW_BUCKET)
    except (NotFoundError, BucketNotFoundError):
        kv = None
    if kv is not None:
        for doc in SHADOW_DOCS:
            try:
                await kv.get(shadow_key(env, vid, doc))
                return True
            except (KeyNotFoundError, NotFoundError):
                continue
    subject = event_filter(env, vid)
    try:
        si = await js.stream_info(EVENTS_STREAM, subjects_filter=subject)
    except NotFoundError:
        return False
    return bool(si.state.subjects)


def deadline_text(deadline_s: float) -> str:
    """`06:42:30Z (30 s from now)`: when a queued command expires."""
    at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=deadline_s)
    return f"{at:%H:%M:%S}Z ({deadline_s:g} s from now)"


# -- connecting ---------------------------------------------------------------


Refused = natsconn.NatsRefused  # every server refused the connection


async def connect(args: argparse.Namespace, *, name: str, **extra: Any) -> Client:
    """The operator commands' connection (`natsconn.connect_once`), ending at once when every server refuses."""
    return await natsconn.connect_once(natsconn.options_from_args(args, name=name), refused_is_final=True, **extra)
