"""`mavjet rollout`'s IO: the rollout documents in TWIN_ROLLOUTS, the vehicles' shadows, the events.

Every write a rollout makes is safe to repeat, because an operator process
may be killed between any two of them and `resume` starts again from the
stored document:

- the previous desired of a vehicle is saved (`create`: the first save wins)
  before its desired is written;
- a vehicle still WAITING in the stored document whose desired already
  carries the change, with a saved previous at another revision, was
  written by the killed process: that revision is adopted, not written again;
- the rollout document is written with `update(last=revision)`: a second
  operator process on the same rollout, or an `abort`, makes the other's
  next write fail, and it re-reads instead of overwriting;
- events carry a `Nats-Msg-Id` made of the rollout, the type and the wave or
  vehicle, so a resumed process re-publishing one is de-duplicated.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import api as jsapi
from nats.js.kv import KeyValue

from mavjet.contract.envelope import CONTENT_TYPE, pack
from mavjet.contract.errors import MavjetError
from mavjet.contract.events import EventType
from mavjet.contract.subjects import (
    ROLLOUTS_BUCKET,
    SHADOW_BUCKET,
    event_subject,
    rollout_event_subject,
    rollout_key,
    rollout_previous_key,
    shadow_key,
    state_filter,
    tags_key,
)
from mavjet.gateway.shadow.document import parse_desired
from mavjet.ops.rollout_plan import Failure, Observation, Rollout, RolloutError
from mavjet.ops.rollout_targets import apply_change

STATUS_FRESH_S = 10.0  # a status sample older than this: no gateway is serving the vehicle now
_GET_CONCURRENCY = 32  # KV gets in flight at once while observing a wave


class RolloutConflict(MavjetError):
    """The stored rollout changed under this process (another operator, or an abort)."""


class RolloutNotFound(MavjetError):
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteOutcome:
    revision: int = 0
    previous_revision: int = 0
    failure: Failure | None = None
    detail: str = ""


def _loads(raw: bytes | None) -> Any:
    try:
        return json.loads(raw or b"null")
    except ValueError:
        return None


class RolloutStore:
    """The buckets and the stream a rollout reads and writes, for one env."""

    def __init__(self, nc: Client, env: str, shadow: KeyValue, rollouts: KeyValue) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.env = env
        self.shadow = shadow
        self.rollouts = rollouts

    @classmethod
    async def open(cls, nc: Client, env: str) -> RolloutStore:
        from mavjet.ops.resolve import NotProvisioned

        js = nc.jetstream()
        try:
            shadow = await js.key_value(SHADOW_BUCKET)
            rollouts = await js.key_value(ROLLOUTS_BUCKET)
        except (nats.js.errors.NotFoundError, nats.js.errors.BucketNotFoundError):
            raise NotProvisioned(env, f"{SHADOW_BUCKET} or {ROLLOUTS_BUCKET}") from None
        try:  # TWIN_EVENTS from before rollouts does not take their events
            await js.find_stream_name_by_subject(rollout_event_subject(env, "x", EventType.ROLLOUT_STARTED))
        except nats.js.errors.NotFoundError:
            raise NotProvisioned(env, "TWIN_EVENTS' subject fleet.<env>.rollout.*.evt.>") from None
        return cls(nc, env, shadow, rollouts)

    # -- rollout documents ---------------------------------------------------------------

    async def load(self, rollout_id: str) -> tuple[Rollout, int]:
        try:
            e = await self.rollouts.get(rollout_key(self.env, rollout_id))
        except nats.js.errors.KeyNotFoundError:
            raise RolloutNotFound(f"no rollout {rollout_id!r} in env {self.env!r}: `mavjet rollout status` lists them") from None
        raw = _loads(e.value)
        if not isinstance(raw, dict):
            raise RolloutError(f"rollout {rollout_id!r}: stored document is not a JSON object")
        return Rollout.from_json(raw), int(e.revision or 0)

    async def create(self, r: Rollout) -> int:
        try:
            return int(await self.rollouts.create(rollout_key(self.env, r.id), _dump(r)))
        except nats.js.errors.KeyWrongLastSequenceError:
            raise RolloutError(f"rollout {r.id!r} exists already: `mavjet rollout status {r.id}`") from None

    async def save(self, r: Rollout, last: int) -> int:
        try:
            return int(await self.rollouts.update(rollout_key(self.env, r.id), _dump(r), last=last))
        except nats.js.errors.KeyWrongLastSequenceError:
            raise RolloutConflict(f"rollout {r.id!r} was changed by another process (an abort, or a second "
                                  "operator resuming it)") from None

    async def list(self) -> list[Rollout]:
        out = []
        for raw in (await self._last_values(f"$KV.{ROLLOUTS_BUCKET}.{rollout_key(self.env, '*')}")).values():
            doc = _loads(raw)
            if isinstance(doc, dict):
                try:
                    out.append(Rollout.from_json(doc))
                except RolloutError:
                    continue  # one unreadable document does not hide the others
        return sorted(out, key=lambda r: r.created_s)

    # -- targets --------------------------------------------------------------------------

    async def tag_views(self) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
        """vid -> (its meta, its operator tags), for every vehicle with either."""
        metas = await self._last_values(f"$KV.{SHADOW_BUCKET}.{shadow_key(self.env, '*', 'meta')}")
        tags = await self._last_values(f"$KV.{ROLLOUTS_BUCKET}.{tags_key(self.env, '*')}")
        out: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
        for src, idx in ((metas, 0), (tags, 1)):
            for subject, raw in src.items():
                vid = subject.split(".")[5]  # $KV.<bucket>.fleet.<env>.veh.<vid>.<doc>
                doc = _loads(raw)
                pair = out.setdefault(vid, ({}, {}))
                if isinstance(doc, dict):
                    pair[idx].update(doc)
        return out

    async def get_tags(self, vid: str) -> tuple[int, dict[str, Any]]:
        try:
            e = await self.rollouts.get(tags_key(self.env, vid))
        except nats.js.errors.KeyNotFoundError:
            return 0, {}
        doc = _loads(e.value)
        return int(e.revision or 0), doc if isinstance(doc, dict) else {}

    async def set_tags(self, vid: str, tags: Mapping[str, str], last: int) -> int:
        data = json.dumps(dict(sorted(tags.items()))).encode()
        try:
            if last:
                return int(await self.rollouts.update(tags_key(self.env, vid), data, last=last))
            return int(await self.rollouts.create(tags_key(self.env, vid), data))
        except nats.js.errors.KeyWrongLastSequenceError:
            raise RolloutError(f"{vid}'s tags changed since they were read; try again") from None

    async def _last_values(self, subject: str) -> dict[str, bytes]:
        """The newest stored value of every KV key matching `subject` (a wildcard), deleted ones left out."""
        stream = "KV_" + subject.split(".")[1]
        try:
            info = await self.js.stream_info(stream, subjects_filter=subject)
        except nats.js.errors.NotFoundError:
            return {}
        want = len(info.state.subjects or {})
        out: dict[str, bytes] = {}
        if not want:
            return out
        done = asyncio.Event()
        seen = 0

        async def cb(msg: Any) -> None:
            nonlocal seen
            seen += 1
            op = (msg.headers or {}).get("KV-Operation")
            if op in ("DEL", "PURGE"):
                out.pop(msg.subject, None)
            else:
                out[msg.subject] = msg.data
            if msg.metadata.num_pending == 0 or seen >= want:
                done.set()

        sub = await self.js.subscribe(subject, cb=cb, ordered_consumer=True,
                                      config=jsapi.ConsumerConfig(deliver_policy=jsapi.DeliverPolicy.LAST_PER_SUBJECT))
        try:
            with anyio.move_on_after(10.0):
                await done.wait()
        finally:
            await sub.unsubscribe()
        return out

    # -- observing ------------------------------------------------------------------------

    async def observe(self, vids: Sequence[str], *, now: dt.datetime | None = None) -> dict[str, Observation]:
        """Armed (TWIN_STATE status), link and reported (TWIN_SHADOW) for `vids`."""
        from mavjet.ops.read import Record, read_until_caught_up

        if not vids:
            return {}
        now = now or dt.datetime.now(dt.UTC)
        wanted = set(vids)
        status: dict[str, Record] = {}

        def keep(rec: Record) -> None:
            if rec.vid in wanted:
                status[rec.vid] = rec

        await read_until_caught_up(self.js, state_filter(self.env, "*", "status"),
                                   jsapi.ConsumerConfig(deliver_policy=jsapi.DeliverPolicy.LAST_PER_SUBJECT), keep)
        reported: dict[str, Any] = {}
        limit = anyio.Semaphore(_GET_CONCURRENCY)

        async def get(vid: str) -> None:
            async with limit:
                try:
                    e = await self.shadow.get(shadow_key(self.env, vid, "reported"))
                except nats.js.errors.KeyNotFoundError:
                    return
                reported[vid] = _loads(e.value)

        async with anyio.create_task_group() as tg:
            for vid in vids:
                tg.start_soon(get, vid)
        out: dict[str, Observation] = {}
        for vid in vids:
            rec = status.get(vid)
            rep = reported.get(vid)
            rep = rep if isinstance(rep, dict) else None
            fresh = rec is not None and (now - rec.time).total_seconds() < STATUS_FRESH_S
            armed = rec.data.get("armed") if rec is not None and fresh else None
            link_up = fresh and rep is not None and rep.get("link") == "up"
            out[vid] = Observation(armed=armed if isinstance(armed, bool) else None, link_up=link_up, reported=rep)
        return out

    # -- writing desired -------------------------------------------------------------------

    async def _desired(self, vid: str) -> tuple[int, Any]:
        try:
            e = await self.shadow.get(shadow_key(self.env, vid, "desired"))
        except nats.js.errors.KeyNotFoundError:
            return 0, None
        return int(e.revision or 0), _loads(e.value)

    async def _previous(self, r: Rollout, vid: str) -> dict[str, Any] | None:
        try:
            e = await self.rollouts.get(rollout_previous_key(self.env, r.id, vid))
        except nats.js.errors.KeyNotFoundError:
            return None
        doc = _loads(e.value)
        return doc if isinstance(doc, dict) else None

    async def write_desired(self, r: Rollout, vid: str) -> WriteOutcome:
        """Merge the change into `vid`'s desired (revision-checked), saving the previous one first."""
        for _ in range(3):  # a concurrent `shadow set` moves the revision: read again, at most twice
            rev, cur = await self._desired(vid)
            cur_doc = cur if isinstance(cur, dict) else {}
            new = apply_change(cur_doc, r.change)
            prev = await self._previous(r, vid)
            if new == cur_doc and prev is not None and prev.get("revision") != rev:
                # written by a process killed before it stored the fact: adopt that revision
                return WriteOutcome(revision=rev, previous_revision=int(prev.get("revision") or 0))
            errors = parse_desired(json.dumps(new).encode(), revision=0).errors
            bad = {p: why for p, why in errors.items() if any(p == c or p.startswith(c + ".") or c.startswith(p + ".")
                                                              for c in r.change) or p == "$"}
            if bad:
                return WriteOutcome(failure=Failure.INVALID,
                                    detail="; ".join(f"{p}: {why}" for p, why in sorted(bad.items())))
            if prev is None:
                try:
                    await self.rollouts.create(rollout_previous_key(self.env, r.id, vid),
                                               json.dumps({"revision": rev, "value": cur}).encode())
                except nats.js.errors.KeyWrongLastSequenceError:
                    pass  # saved by an earlier attempt: the first save is the one that counts
                prev = {"revision": rev}
            if new == cur_doc:  # already as the rollout wants it: nothing to write, converge at this revision
                return WriteOutcome(revision=rev, previous_revision=rev)
            data = json.dumps(new, indent=2, sort_keys=True).encode()
            try:
                written = (await self.shadow.update(shadow_key(self.env, vid, "desired"), data, last=rev) if rev
                           else await self.shadow.create(shadow_key(self.env, vid, "desired"), data))
            except nats.js.errors.KeyWrongLastSequenceError:
                continue
            return WriteOutcome(revision=int(written), previous_revision=int(prev.get("revision") or 0))
        return WriteOutcome(failure=Failure.CONFLICT, detail="desired kept changing while the rollout wrote it")

    async def restore(self, r: Rollout, vid: str, revision: int) -> tuple[bool, str]:
        """Put back `vid`'s previous desired if desired is still the rollout's `revision`: (restored, detail)."""
        rev, _ = await self._desired(vid)
        if rev != revision:
            return False, f"desired changed since the rollout wrote it (revision {rev}, not {revision}): left as is"
        prev = await self._previous(r, vid)
        if prev is None:
            return False, "no previous desired saved"
        value = prev.get("value")
        key = shadow_key(self.env, vid, "desired")
        try:
            if value is None:
                await self.shadow.delete(key, last=rev)
                return True, "desired removed (there was none before)"
            written = await self.shadow.update(key, json.dumps(value, indent=2, sort_keys=True).encode(), last=rev)
        except nats.js.errors.KeyWrongLastSequenceError:
            return False, "desired changed while restoring it: left as is"
        return True, f"previous desired (revision {prev.get('revision')}) restored as revision {written}"

    # -- events ---------------------------------------------------------------------------

    async def fleet_event(self, r: Rollout, etype: EventType, discriminator: str, **data: Any) -> None:
        await self._publish(rollout_event_subject(self.env, r.id, etype), r.id,
                            f"{r.id}:{etype.value}:{discriminator}", {"rollout": r.id, **data})

    async def vehicle_event(self, r: Rollout, vid: str, **data: Any) -> None:
        etype = EventType.ROLLOUT_VEHICLE
        await self._publish(event_subject(self.env, vid, etype), vid,
                            f"{vid}:{etype.value}:{r.id}:{data.get('result')}", {"rollout": r.id, **data})

    async def _publish(self, subject: str, who: str, msg_id: str, data: dict[str, Any]) -> None:
        payload = pack(who, time.time_ns(), data)
        try:
            await self.js.publish(subject, payload, headers={"Content-Type": CONTENT_TYPE, "Nats-Msg-Id": msg_id})
        except (nats.js.errors.NoStreamResponseError, nats.errors.NoRespondersError):
            # TWIN_EVENTS without the rollout subjects (provisioned before rollouts): the rollout goes on
            raise RolloutError(f"TWIN_EVENTS does not take {subject}: run `mavjet provision --env {self.env}` "
                               "again (rollouts added fleet.<env>.rollout.*.evt.> to it)") from None


def _dump(r: Rollout) -> bytes:
    return json.dumps(r.to_json(), sort_keys=True, separators=(",", ":")).encode()

