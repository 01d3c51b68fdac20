"""One vehicle's lease, as a sans-IO machine (docs/ownership.md).

The machine never touches NATS, a clock or a task: the keeper
(`keeper.py`) asks it for the next KV operation (`next_op(now)`), performs
it, and feeds back what happened (`on_result(now, result)`); `may_act(now)`
answers from the monotonic time it is given. So every rule below is tested
with fake times and fake results (tests/ownership/test_lease.py).

The rules, each for a reason:

- Acquire by create (`last=0`, or the tombstone's revision after a release),
  take over by update-by-revision. Both are compare-and-set on the key's last
  revision, so two gateways can never both succeed: split brain is impossible
  whatever the clocks say.
- A standby takes over only once *it* has watched the same revision for
  `ttl_s` on its own monotonic clock, the clock started when the observation
  *arrived*. The value's wall-clock times are shown to operators and never
  compared: clocks of two hosts may disagree by minutes.
- The owner may act until `sent + fence_after_s`, `sent` being the monotonic
  time its last successful renew was *sent* (not answered): the write that
  kept the revision fresh left no earlier than that, so no standby's TTL can
  have started earlier. `fence_after_s < ttl_s - margin`, so the owner stops
  before anyone may take over, whether it was partitioned, paused or
  starved: `may_act` is computed from the clock at each call, not by a timer
  that a stopped loop would never fire.
- A conflict on renew makes the owner stop acting at once and read the key:
  its own write (a renew that timed out but landed) lets it renew again;
  anyone else's means it lost.
- Release is a delete with the last revision, so a stale owner cannot delete
  its successor's lease.
- The fencing token is the revision of the write that started the term
  (create or takeover). Revisions are the bucket's stream sequence: every
  later term's token is greater than any revision an earlier owner wrote.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from mavjet.contract.errors import ConfigError

__all__ = [
    "MIN_MARGIN_S",
    "ChangeKind",
    "Intent",
    "LeaseMachine",
    "LeaseOp",
    "LeaseResult",
    "LeaseState",
    "LeaseTiming",
    "LeaseValue",
    "OpKind",
    "Outcome",
    "OwnershipChange",
    "decode_value",
    "encode_value",
]

# The least gap between the owner's fence and a standby's takeover. It covers
# what happens between `may_act` answering True and the frame leaving (the
# daemon checks right before its write, with no await between), the drift of
# two monotonic clocks' rates over one TTL (ppm: microseconds), and a frame
# already in the link's buffers. Half a second is far more than all of them.
MIN_MARGIN_S = 0.5


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseTiming:
    """The lease's clock, the same for every gateway of a fleet (docs/ownership.md, "Timing").

    Takeover after a crash: within `ttl_s` + one `renew_every_s` poll + a
    round trip (about 6 s with the defaults; the issue's goal is <= 7 s).
    """

    ttl_s: float = 5.0  # a standby takes over after watching one revision this long
    renew_every_s: float = 1.0  # the owner renews (and a standby reads) this often
    fence_after_s: float = 3.5  # the owner stops acting this long after its last good renew was sent
    op_timeout_s: float = 0.75  # one KV operation's bound: a late answer is a failed one
    release_retry_s: float = 0.2  # a failed release is tried again this soon (the caller bounds the total)

    def __post_init__(self) -> None:
        if self.renew_every_s <= 0 or self.ttl_s <= 0:
            raise ConfigError("ownership.timing", "ttl_s and renew_every_s must be positive")
        if not 0 < self.op_timeout_s < self.renew_every_s:
            raise ConfigError("ownership.op_timeout_s", "must be positive and less than renew_every_s "
                              "(one slow operation must not delay the next renew)")
        if self.fence_after_s < 2 * self.renew_every_s:
            raise ConfigError("ownership.fence_after_s", "must allow at least two renews "
                              f"(>= 2 x renew_every_s = {2 * self.renew_every_s}): one lost renew must not fence")
        if self.fence_after_s > self.ttl_s - MIN_MARGIN_S:
            raise ConfigError("ownership.fence_after_s", f"must be at most ttl_s - {MIN_MARGIN_S} s "
                              f"({self.ttl_s - MIN_MARGIN_S}): the owner stops before a standby may take over")
        if self.release_retry_s <= 0:
            raise ConfigError("ownership.release_retry_s", "must be positive")


class LeaseState(StrEnum):
    STANDBY = "standby"  # another gateway owns the vehicle, or nobody yet: watching the key
    OWNER = "owner"  # holds the lease, renewed in time: may act until the fence deadline
    FENCED = "fenced"  # may still hold the lease but cannot prove it in time: acts on nothing
    RELEASING = "releasing"  # deleting its lease on a clean stop: acts on nothing
    STOPPED = "stopped"  # released (or never owned and told to stop): does nothing more


class Intent(StrEnum):
    """Why an operation is sent; the keeper performs `kind`, the machine reads the answer by intent."""

    OBSERVE = "observe"  # standby: read the key
    ACQUIRE = "acquire"  # create (the key is absent or a tombstone)
    TAKE_OVER = "take_over"  # update a stale lease by its revision
    RENEW = "renew"  # owner: update by its own last revision
    CHECK = "check"  # owner after a conflict: read the key to learn whose it is
    RELEASE = "release"  # delete by its own last revision


class OpKind(StrEnum):
    GET = "get"
    WRITE = "write"  # a value with Nats-Expected-Last-Subject-Sequence = last
    DELETE = "delete"  # a delete marker with Nats-Expected-Last-Subject-Sequence = last


_KIND = {
    Intent.OBSERVE: OpKind.GET, Intent.CHECK: OpKind.GET, Intent.ACQUIRE: OpKind.WRITE,
    Intent.TAKE_OVER: OpKind.WRITE, Intent.RENEW: OpKind.WRITE, Intent.RELEASE: OpKind.DELETE,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseOp:
    """One KV operation to perform now. `sent_at` is when the machine decided it (monotonic s)."""

    intent: Intent
    sent_at: float
    last: int = 0  # expected last revision (0: the key must not exist); unused by a get
    term: int = 0  # the token of the term a renew or release belongs to (written into the value)

    @property
    def kind(self) -> OpKind:
        return _KIND[self.intent]


class Outcome(StrEnum):
    WRITTEN = "written"  # a write or delete was stored at `revision`
    CONFLICT = "conflict"  # the key's last revision was not `last`
    SEEN = "seen"  # a get found a lease held by `holder` at `revision`
    ABSENT = "absent"  # a get found no lease (`revision`: the tombstone's, 0 if the key never existed)
    FAILED = "failed"  # no answer in time, no connection, no bucket: the outcome is unknown


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseResult:
    outcome: Outcome
    revision: int = 0
    holder: str | None = None
    detail: str = ""

    @classmethod
    def written(cls, revision: int) -> LeaseResult:
        return cls(outcome=Outcome.WRITTEN, revision=revision)

    @classmethod
    def conflict(cls, detail: str = "") -> LeaseResult:
        return cls(outcome=Outcome.CONFLICT, detail=detail)

    @classmethod
    def seen(cls, revision: int, holder: str) -> LeaseResult:
        return cls(outcome=Outcome.SEEN, revision=revision, holder=holder)

    @classmethod
    def absent(cls, revision: int = 0) -> LeaseResult:
        return cls(outcome=Outcome.ABSENT, revision=revision)

    @classmethod
    def failed(cls, detail: str) -> LeaseResult:
        return cls(outcome=Outcome.FAILED, detail=detail)


class ChangeKind(StrEnum):
    ACQUIRED = "acquired"  # this gateway created the lease (nobody held it)
    TAKEN_OVER = "taken_over"  # this gateway took a stale lease from `previous`
    LOST = "lost"  # `holder` (or nobody: deleted) has the lease this gateway held
    FENCED = "fenced"  # this gateway stopped acting: no renew confirmed in time
    RESUMED = "resumed"  # a fenced owner renewed its own lease: acting again, same term
    RELEASED = "released"  # this gateway deleted its lease on a clean stop
    OWNER_SEEN = "owner_seen"  # a standby saw a new holder (or none) of the key


@dataclass(frozen=True, slots=True, kw_only=True)
class OwnershipChange:
    """An ownership change of one vehicle, with both parties (the daemon turns these into events)."""

    vid: str
    kind: ChangeKind
    holder: str | None  # the owner after the change (None: nobody)
    previous: str | None  # the owner before it (None: nobody or unknown)
    token: int  # the term's fencing token (the revision that started it; 0: none)
    at_s: float  # monotonic time of the change


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseValue:
    """What the key holds. Only `holder` decides anything; the rest is for operators."""

    holder: str  # unique per process: instance@host:pid:nonce
    instance: str
    host: str
    pid: int
    since: str  # wall-clock start of the term, ISO 8601 UTC (shown, never compared)
    term: int = 0  # the term's token; 0 in the write that starts it (its revision is not known before)


def encode_value(v: LeaseValue) -> bytes:
    """JSON, like the shadow's documents: `nats kv get TWIN_LEASES …` shows it as it is."""
    doc: dict[str, Any] = {"v": 1, "holder": v.holder, "instance": v.instance, "host": v.host,
                           "pid": v.pid, "since": v.since, "term": v.term}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def decode_value(raw: bytes) -> LeaseValue | None:
    """The value, or None when it is not a lease (someone wrote garbage: a holder nobody is)."""
    try:
        doc = json.loads(raw)
        return LeaseValue(holder=str(doc["holder"]), instance=str(doc.get("instance", "")),
                          host=str(doc.get("host", "")), pid=int(doc.get("pid", 0)),
                          since=str(doc.get("since", "")), term=int(doc.get("term", 0)))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


@dataclass(slots=True)
class _Seen:
    revision: int
    holder: str | None  # None: absent (deleted or never written)
    since_s: float  # when this gateway first saw this revision (monotonic)


class LeaseMachine:
    """The lease of one vehicle for one gateway. Not thread-safe; one keeper drives it."""

    def __init__(self, *, vid: str, me: str, timing: LeaseTiming, now: float) -> None:
        self.vid = vid
        self.me = me
        self.timing = timing
        self._state = LeaseState.STANDBY
        self._revision = 0  # the owner's last known revision of its own lease
        self._term = 0  # the fencing token of the current (or last) term
        self._deadline_s = float("-inf")  # the owner may act strictly before this
        self._seen: _Seen | None = None  # a standby's observation of the key
        self._check = False  # the owner must read the key before renewing again
        self._pending: LeaseOp | None = None
        self._next_s = now
        self._changes: list[OwnershipChange] = []
        self._answered = False  # any operation answered or failed: the owner is as known as it can be

    # --- what the daemon asks -------------------------------------------------------------------

    def may_act(self, now: float) -> bool:
        """True only for an owner whose fence deadline is still ahead at `now`."""
        return self._state is LeaseState.OWNER and now < self._deadline_s

    def may_record(self, now: float) -> bool:
        """Whether what the vehicle says may be recorded (spooled, published when it can be).

        The owner, and a gateway that cannot know of another owner: a fenced owner
        cut from NATS (the companion computer whose uplink dropped), or one that
        never reached NATS. Not a gateway that knows another one owns the vehicle
        (a standby, or an owner that lost it), nor one before its first answer.
        Recording acts on nothing; only `may_act` allows acting.
        """
        if self.may_act(now):
            return True
        if not self._answered or self._state in (LeaseState.RELEASING, LeaseState.STOPPED):
            return False
        holder = self.holder
        return holder is None or holder == self.me

    def state(self, now: float) -> LeaseState:
        """The state at `now` (an owner past its deadline is fenced even before the keeper runs)."""
        if self._state is LeaseState.OWNER and now >= self._deadline_s:
            return LeaseState.FENCED
        return self._state

    @property
    def token(self) -> int:
        """The fencing token of the current or last term (0: never owned)."""
        return self._term

    @property
    def revision(self) -> int:
        return self._revision

    @property
    def deadline_s(self) -> float:
        return self._deadline_s

    @property
    def holder(self) -> str | None:
        """Who holds the lease as far as this gateway knows (None: nobody or not known yet)."""
        if self._state in (LeaseState.OWNER, LeaseState.FENCED, LeaseState.RELEASING):
            return self.me
        return self._seen.holder if self._seen is not None else None

    @property
    def pending(self) -> LeaseOp | None:
        return self._pending

    def take_changes(self) -> list[OwnershipChange]:
        out, self._changes = self._changes, []
        return out

    # --- what the keeper drives -----------------------------------------------------------------

    def wake_at(self) -> float | None:
        """When `next_op` may next have something to do (None: waiting for a result or stopped)."""
        if self._pending is not None or self._state is LeaseState.STOPPED:
            return None
        if self._state is LeaseState.OWNER:
            return min(self._next_s, self._deadline_s)  # wake at the deadline to report the fence
        return self._next_s

    def next_op(self, now: float) -> LeaseOp | None:
        """The operation to perform now, or None. At most one is outstanding."""
        self._fence_if_due(now)
        if self._pending is not None or self._state is LeaseState.STOPPED or now < self._next_s:
            return None
        op: LeaseOp
        if self._state is LeaseState.RELEASING:
            op = LeaseOp(intent=Intent.RELEASE, sent_at=now, last=self._revision, term=self._term)
        elif self._state in (LeaseState.OWNER, LeaseState.FENCED):
            if self._check:
                op = LeaseOp(intent=Intent.CHECK, sent_at=now)
            else:
                op = LeaseOp(intent=Intent.RENEW, sent_at=now, last=self._revision, term=self._term)
        elif self._seen is None:
            op = LeaseOp(intent=Intent.OBSERVE, sent_at=now)
        elif self._seen.holder is None:
            op = LeaseOp(intent=Intent.ACQUIRE, sent_at=now, last=self._seen.revision)
        elif now - self._seen.since_s >= self.timing.ttl_s:
            op = LeaseOp(intent=Intent.TAKE_OVER, sent_at=now, last=self._seen.revision)
        else:
            op = LeaseOp(intent=Intent.OBSERVE, sent_at=now)
        self._pending = op
        return op

    def heard_release(self, now: float) -> None:
        """The key was deleted (the owner released it, seen on the bucket's subject): a standby reads at once.

        Only a hint, never a decision: the read that follows, and the create after
        it, are what count, so a spurious or forged hint costs one read.
        """
        if self._state is LeaseState.STANDBY and self._pending is None:
            self._next_s = min(self._next_s, now)

    def release(self, now: float) -> None:
        """Stop acting now; an owner deletes its lease (the keeper performs it), anyone else just stops."""
        self._fence_if_due(now)
        if self._state in (LeaseState.OWNER, LeaseState.FENCED):
            self._state = LeaseState.RELEASING
            self._next_s = now
        elif self._state is LeaseState.STANDBY:
            self._state = LeaseState.STOPPED

    def on_result(self, now: float, result: LeaseResult) -> None:
        """Feed the answer to the outstanding operation (ignored when none is outstanding)."""
        op, self._pending = self._pending, None
        if op is None:
            return
        self._answered = True
        if op.intent is Intent.RELEASE:
            self._released(now, op, result)
        elif self._state is LeaseState.RELEASING:
            # A renew or check answered after release() was called: only the revision matters now.
            ours = (result.outcome is Outcome.WRITTEN and op.intent is Intent.RENEW) or (
                result.outcome is Outcome.SEEN and result.holder == self.me)
            if ours:
                self._revision = result.revision
            elif result.outcome in (Outcome.SEEN, Outcome.ABSENT):
                self._lose(now, result)
                self._state = LeaseState.STOPPED
            self._next_s = now
        elif op.intent in (Intent.OBSERVE, Intent.CHECK):
            self._observed(now, op, result)
        elif op.intent in (Intent.ACQUIRE, Intent.TAKE_OVER):
            self._acquired(now, op, result)
        else:
            self._renewed(now, op, result)
        self._fence_if_due(now)

    # --- the transitions ------------------------------------------------------------------------

    def _fence_if_due(self, now: float) -> None:
        if self._state is LeaseState.OWNER and now >= self._deadline_s:
            self._state = LeaseState.FENCED
            self._change(ChangeKind.FENCED, now, holder=self.me, previous=self.me)

    def _change(self, kind: ChangeKind, now: float, *, holder: str | None, previous: str | None) -> None:
        self._changes.append(OwnershipChange(vid=self.vid, kind=kind, holder=holder, previous=previous,
                                             token=self._term, at_s=now))

    def _retry_at(self, op: LeaseOp, now: float) -> float:
        # A failure that came at once (no connection) must not turn into a busy loop.
        return max(now, op.sent_at + self.timing.renew_every_s)

    def _observed(self, now: float, op: LeaseOp, result: LeaseResult) -> None:
        if result.outcome is Outcome.FAILED or result.outcome is Outcome.CONFLICT:
            self._next_s = self._retry_at(op, now)
            return
        holder = result.holder if result.outcome is Outcome.SEEN else None
        if holder is not None and holder == self.me:
            # Our own write landed although we did not see its answer (a timed-out create or
            # takeover, or a renew before a conflict). We hold the lease but cannot tell since
            # when: stay fenced until a renew sent from now on succeeds.
            was_owner = self._state in (LeaseState.OWNER, LeaseState.FENCED)
            if self._state is LeaseState.OWNER:
                self._change(ChangeKind.FENCED, now, holder=self.me, previous=self.me)
            self._revision = result.revision
            if not was_owner:
                self._term = result.revision
            self._state = LeaseState.FENCED
            self._check = False
            self._next_s = now
            return
        if self._state in (LeaseState.OWNER, LeaseState.FENCED):
            self._lose(now, result)
            return
        prev = self._seen
        if prev is None or prev.revision != result.revision or prev.holder != holder:
            # A new revision: this gateway's TTL clock for it starts now, when the answer arrived.
            self._seen = _Seen(revision=result.revision, holder=holder, since_s=now)
            if (prev is None and holder is not None) or (prev is not None and prev.holder != holder):
                self._change(ChangeKind.OWNER_SEEN, now, holder=holder, previous=prev.holder if prev else None)
        if holder is None:
            self._next_s = now  # nobody holds it: create at once
        else:
            assert self._seen is not None
            self._next_s = min(now + self.timing.renew_every_s, self._seen.since_s + self.timing.ttl_s)

    def _lose(self, now: float, result: LeaseResult) -> None:
        holder = result.holder if result.outcome is Outcome.SEEN else None
        if self._state is LeaseState.OWNER:
            self._change(ChangeKind.FENCED, now, holder=self.me, previous=self.me)
        self._state = LeaseState.STANDBY
        self._check = False
        self._deadline_s = float("-inf")
        self._seen = _Seen(revision=result.revision, holder=holder, since_s=now)
        self._change(ChangeKind.LOST, now, holder=holder, previous=self.me)
        self._next_s = now if holder is None else now + self.timing.renew_every_s

    def _acquired(self, now: float, op: LeaseOp, result: LeaseResult) -> None:
        if result.outcome is Outcome.WRITTEN:
            previous = self._seen.holder if (self._seen is not None and op.intent is Intent.TAKE_OVER) else None
            self._state = LeaseState.OWNER
            self._revision = self._term = result.revision
            self._deadline_s = op.sent_at + self.timing.fence_after_s
            self._seen = None
            self._check = False
            self._next_s = op.sent_at + self.timing.renew_every_s
            kind = ChangeKind.TAKEN_OVER if op.intent is Intent.TAKE_OVER else ChangeKind.ACQUIRED
            self._change(kind, now, holder=self.me, previous=previous)
            self._fence_if_due(now)
            return
        # Lost the race (CONFLICT) or do not know (FAILED: the write may have landed): read again.
        self._seen = None
        self._next_s = now if result.outcome is Outcome.CONFLICT else self._retry_at(op, now)

    def _renewed(self, now: float, op: LeaseOp, result: LeaseResult) -> None:
        if result.outcome is Outcome.WRITTEN:
            self._revision = result.revision
            self._deadline_s = max(self._deadline_s, op.sent_at + self.timing.fence_after_s)
            if self._state is LeaseState.FENCED and now < self._deadline_s:
                self._state = LeaseState.OWNER
                self._change(ChangeKind.RESUMED, now, holder=self.me, previous=self.me)
            self._next_s = op.sent_at + self.timing.renew_every_s
        elif result.outcome is Outcome.CONFLICT:
            # Someone wrote the key since our last revision: stop acting until we know who.
            if self._state is LeaseState.OWNER:
                self._state = LeaseState.FENCED
                self._change(ChangeKind.FENCED, now, holder=self.me, previous=self.me)
            self._check = True
            self._next_s = now
        else:
            self._next_s = self._retry_at(op, now)

    def _released(self, now: float, op: LeaseOp, result: LeaseResult) -> None:
        if result.outcome is Outcome.WRITTEN:
            self._state = LeaseState.STOPPED
            self._revision = result.revision
            self._change(ChangeKind.RELEASED, now, holder=None, previous=self.me)
        elif result.outcome is Outcome.CONFLICT:
            # Not ours any more (taken over while we could not renew): nothing to delete.
            self._state = LeaseState.STOPPED
            self._change(ChangeKind.LOST, now, holder=None, previous=self.me)
        else:
            self._next_s = max(now, op.sent_at + self.timing.release_retry_s)
