"""The lease machine, pure: fake monotonic times and fake KV answers (docs/ownership.md)."""

from __future__ import annotations

import pytest

from mavjet.contract.errors import ConfigError
from mavjet.gateway.ownership.lease import (
    ChangeKind,
    Intent,
    LeaseMachine,
    LeaseOp,
    LeaseResult,
    LeaseState,
    LeaseTiming,
    LeaseValue,
    OpKind,
    decode_value,
    encode_value,
)

T = LeaseTiming()  # ttl 5, renew 1, fence 3.5
ME, OTHER = "gw-a@h:1:aa", "gw-b@h:2:bb"


def machine(now: float = 0.0, me: str = ME) -> LeaseMachine:
    return LeaseMachine(vid="VID-001", me=me, timing=T, now=now)


def owned(at: float = 0.0, revision: int = 10) -> LeaseMachine:
    """A machine that read an empty key and created the lease at `revision`."""
    m = machine(at)
    op = m.next_op(at)
    assert op is not None and op.intent is Intent.OBSERVE
    m.on_result(at, LeaseResult.absent())
    op = m.next_op(at)
    assert op is not None and op.intent is Intent.ACQUIRE and op.last == 0
    m.on_result(at + 0.01, LeaseResult.written(revision))
    return m


def renew(m: LeaseMachine, at: float, result: LeaseResult) -> None:
    op = m.next_op(at)
    assert op is not None and op.intent is Intent.RENEW, op
    m.on_result(at + 0.01, result)


def test_timing_keeps_the_fence_before_the_ttl() -> None:
    assert T.fence_after_s < T.ttl_s - 0.5 and T.op_timeout_s < T.renew_every_s
    with pytest.raises(ConfigError, match="fence_after_s"):
        LeaseTiming(ttl_s=5.0, fence_after_s=4.8)
    with pytest.raises(ConfigError, match="two renews"):
        LeaseTiming(renew_every_s=2.0, fence_after_s=3.5)
    with pytest.raises(ConfigError, match="op_timeout_s"):
        LeaseTiming(op_timeout_s=1.0)


def test_acquire_on_an_empty_key() -> None:
    m = machine()
    assert not m.may_act(0.0)
    m = owned(0.0, revision=10)
    assert m.state(0.1) is LeaseState.OWNER and m.may_act(0.1)
    assert m.token == 10 and m.holder == ME
    [change] = m.take_changes()
    assert change.kind is ChangeKind.ACQUIRED and change.holder == ME and change.previous is None
    assert change.token == 10


def test_acquire_over_a_tombstone_expects_its_revision() -> None:
    m = machine()
    m.next_op(0.0)
    m.on_result(0.0, LeaseResult.absent(revision=7))  # released earlier: a delete marker at 7
    op = m.next_op(0.0)
    assert op is not None and op.intent is Intent.ACQUIRE and op.last == 7


def test_conflict_on_create_reads_again_and_stands_by() -> None:
    m = machine()
    m.next_op(0.0)
    m.on_result(0.0, LeaseResult.absent())
    m.next_op(0.0)
    m.on_result(0.01, LeaseResult.conflict())  # the other gateway created it first
    assert not m.may_act(0.02)
    op = m.next_op(0.02)
    assert op is not None and op.intent is Intent.OBSERVE
    m.on_result(0.03, LeaseResult.seen(11, OTHER))
    assert m.state(0.03) is LeaseState.STANDBY and m.holder == OTHER and not m.may_act(0.03)
    assert [c.kind for c in m.take_changes()] == [ChangeKind.OWNER_SEEN]


def test_takeover_only_after_the_ttl_without_a_revision_change() -> None:
    m = machine()
    m.next_op(0.0)
    m.on_result(0.0, LeaseResult.seen(20, OTHER))
    t = 0.0
    # The holder renews every second: each new revision restarts this gateway's clock.
    for rev in range(21, 31):
        t += 1.0
        op = m.next_op(t)
        assert op is not None and op.intent is Intent.OBSERVE, (t, op)
        m.on_result(t, LeaseResult.seen(rev, OTHER))
    # Now it stops renewing: the same revision seen for less than the TTL is no reason to act.
    start = t
    while t + 0.25 < start + T.ttl_s:
        t += 0.25
        op = m.next_op(t)
        if op is not None:
            assert op.intent is Intent.OBSERVE, (t, op)
            m.on_result(t, LeaseResult.seen(30, OTHER))
        if t < start + T.ttl_s:
            assert not m.may_act(t)
    op = m.next_op(start + T.ttl_s)
    assert op is not None and op.intent is Intent.TAKE_OVER and op.last == 30
    m.on_result(start + T.ttl_s + 0.01, LeaseResult.written(31))
    assert m.may_act(start + T.ttl_s + 0.02) and m.token == 31
    change = m.take_changes()[-1]
    assert change.kind is ChangeKind.TAKEN_OVER and change.previous == OTHER and change.holder == ME


def test_a_takeover_that_loses_the_race_stands_by() -> None:
    m = machine()
    m.next_op(0.0)
    m.on_result(0.0, LeaseResult.seen(20, OTHER))
    op = m.next_op(5.0)
    assert op is not None and op.intent is Intent.TAKE_OVER
    m.on_result(5.01, LeaseResult.conflict())  # the holder renewed at the last moment
    assert not m.may_act(5.02)
    m.next_op(5.02)
    m.on_result(5.03, LeaseResult.seen(21, OTHER))
    assert m.next_op(6.0) is None  # a period after the last read, not before
    op = m.next_op(6.1)
    assert op is not None and op.intent is Intent.OBSERVE  # the clock restarted with revision 21


def test_renew_moves_the_deadline_from_when_it_was_sent() -> None:
    m = owned(0.0)
    assert m.next_op(0.5) is None  # not due before renew_every_s
    op = m.next_op(1.0)
    assert op is not None and op.intent is Intent.RENEW and op.last == 10 and op.term == 10
    m.on_result(1.6, LeaseResult.written(12))  # a slow answer: the deadline counts from the send
    assert m.revision == 12 and m.token == 10
    assert m.deadline_s == pytest.approx(1.0 + T.fence_after_s)
    renew(m, 2.0, LeaseResult.written(13))
    assert m.may_act(5.49) and not m.may_act(5.5)


def test_renew_failures_fence_before_the_ttl() -> None:
    m = owned(0.0)
    renew(m, 1.0, LeaseResult.written(11))  # the last good renew, sent at 1.0
    fence = 1.0 + T.fence_after_s
    # A standby that saw revision 11 arrive no earlier than 1.0 takes over at 1.0 + ttl at the soonest.
    assert fence <= 1.0 + T.ttl_s - 0.5
    renews = 0
    for i in range(1, 1000):  # every 10 ms up to 11 s; each renew times out
        t = 1.0 + i / 100
        assert m.may_act(t) is (t < fence), t
        op = m.next_op(t)
        if op is not None:
            assert op.intent is Intent.RENEW
            renews += 1
            m.on_result(t, LeaseResult.failed("timed out"))
    assert renews == 9  # at 2, 3, ... 10 s: retried once a period, no faster
    assert m.state(11.0) is LeaseState.FENCED
    assert ChangeKind.FENCED in [c.kind for c in m.take_changes()]


def test_a_fenced_owner_resumes_when_its_own_renew_lands() -> None:
    m = owned(0.0)
    for t in (1.0, 2.0, 3.0):
        renew(m, t, LeaseResult.failed("no quorum"))  # a leader election on the cluster
    assert not m.may_act(4.0)
    m.take_changes()
    renew(m, 4.0, LeaseResult.written(11))  # fenced at 3.5; the election is over
    assert m.may_act(4.02) and m.token == 10  # the same term: nobody else wrote in between
    assert [c.kind for c in m.take_changes()] == [ChangeKind.FENCED, ChangeKind.RESUMED]


def test_a_renew_conflict_stops_acting_at_once_and_checks() -> None:
    m = owned(0.0)
    op = m.next_op(1.0)
    assert op is not None
    m.on_result(1.01, LeaseResult.conflict())
    assert not m.may_act(1.02)  # well before the deadline, but someone wrote the key
    op = m.next_op(1.02)
    assert op is not None and op.intent is Intent.CHECK
    m.on_result(1.03, LeaseResult.seen(15, OTHER))
    assert m.state(1.03) is LeaseState.STANDBY and m.holder == OTHER
    lost = m.take_changes()[-1]
    assert lost.kind is ChangeKind.LOST and lost.holder == OTHER and lost.previous == ME and lost.token == 10


def test_a_renew_that_timed_out_but_landed_is_found_again() -> None:
    m = owned(0.0)
    renew(m, 1.0, LeaseResult.failed("timed out"))  # it landed at 11 all the same
    renew(m, 2.0, LeaseResult.conflict())  # expected 10, the key is at 11
    op = m.next_op(2.02)
    assert op is not None and op.intent is Intent.CHECK
    m.on_result(2.03, LeaseResult.seen(11, ME))
    assert not m.may_act(2.04)  # ours, but only a renew sent from now on may extend the deadline
    op = m.next_op(2.04)
    assert op is not None and op.intent is Intent.RENEW and op.last == 11
    m.on_result(2.05, LeaseResult.written(12))
    assert m.may_act(2.06) and m.token == 10


def test_release_deletes_with_the_last_revision() -> None:
    m = owned(0.0)
    renew(m, 1.0, LeaseResult.written(11))
    m.take_changes()
    m.release(1.5)
    assert not m.may_act(1.5)  # stops acting before the delete is even sent
    op = m.next_op(1.5)
    assert op is not None and op.intent is Intent.RELEASE and op.last == 11
    m.on_result(1.51, LeaseResult.written(12))
    assert m.state(1.6) is LeaseState.STOPPED and m.next_op(10.0) is None
    [c] = m.take_changes()
    assert c.kind is ChangeKind.RELEASED and c.previous == ME and c.holder is None


def test_a_stale_owner_cannot_delete_its_successor() -> None:
    m = owned(0.0)
    m.release(20.0)  # it slept through the TTL; someone took over meanwhile
    op = m.next_op(20.0)
    assert op is not None and op.intent is Intent.RELEASE and op.last == 10
    m.on_result(20.01, LeaseResult.conflict())  # the store refuses: the key is at another revision
    assert m.state(20.02) is LeaseState.STOPPED
    assert m.take_changes()[-1].kind is ChangeKind.LOST


def test_a_release_waits_for_the_renew_in_flight() -> None:
    m = owned(0.0)
    op = m.next_op(1.0)
    assert op is not None and op.intent is Intent.RENEW
    m.release(1.1)
    assert m.next_op(1.1) is None  # one operation at a time
    m.on_result(1.2, LeaseResult.written(11))
    assert not m.may_act(1.2)
    op = m.next_op(1.2)
    assert op is not None and op.intent is Intent.RELEASE and op.last == 11


def test_a_paused_owner_waking_after_the_ttl_never_acts() -> None:
    m = owned(0.0)
    renew(m, 1.0, LeaseResult.written(11))
    op = m.next_op(2.0)  # sent just before SIGSTOP
    assert op is not None
    wake = 2.0 + T.ttl_s + 10.0  # SIGCONT long after any standby may have taken over
    acted = [m.may_act(wake)]
    # The renew's answer arrives on waking: even a success (it landed before the takeover) is too old.
    m.on_result(wake, LeaseResult.written(12))
    acted.append(m.may_act(wake))
    op = m.next_op(wake)
    acted.append(m.may_act(wake))
    assert op is not None and op.intent is Intent.RENEW
    m.on_result(wake + 0.01, LeaseResult.conflict())
    acted.append(m.may_act(wake + 0.01))
    op = m.next_op(wake + 0.01)
    assert op is not None and op.intent is Intent.CHECK
    m.on_result(wake + 0.02, LeaseResult.seen(14, OTHER))
    acted.append(m.may_act(wake + 0.02))
    assert acted == [False] * 5
    assert m.state(wake + 0.02) is LeaseState.STANDBY
    kinds = [c.kind for c in m.take_changes()]
    assert kinds[-2:] == [ChangeKind.FENCED, ChangeKind.LOST] or kinds[-1] is ChangeKind.LOST


def test_an_unknown_create_that_landed_is_adopted_fenced() -> None:
    m = machine()
    m.next_op(0.0)
    m.on_result(0.0, LeaseResult.absent())
    m.next_op(0.0)
    m.on_result(0.75, LeaseResult.failed("timed out"))
    assert not m.may_act(0.8)
    op = m.next_op(1.0)
    assert op is not None and op.intent is Intent.OBSERVE
    m.on_result(1.01, LeaseResult.seen(5, ME))
    assert m.state(1.01) is LeaseState.FENCED and not m.may_act(1.01) and m.token == 5
    renew(m, 1.02, LeaseResult.written(6))
    assert m.may_act(1.1)


def test_failures_do_not_spin() -> None:
    m = machine()
    ops = 0
    t = 0.0
    while t < 10.0:  # a dead server answers at once: one read a period, not thousands
        op = m.next_op(t)
        if op is not None:
            ops += 1
            m.on_result(t, LeaseResult.failed("no connection"))
        t += 0.01
    assert 9 <= ops <= 11


class Kv:
    """A one-key compare-and-set store with a bucket-wide sequence, to drive machines in turn (pure)."""

    def __init__(self) -> None:
        self.seq = 0
        self.last = 0
        self.holder: str | None = None

    def apply(self, op: LeaseOp, me: str) -> LeaseResult:
        if op.kind is OpKind.GET:
            return LeaseResult.seen(self.last, self.holder) if self.holder else LeaseResult.absent(self.last)
        if op.last != self.last:
            return LeaseResult.conflict()
        self.seq += 1
        self.last = self.seq
        self.holder = None if op.kind is OpKind.DELETE else me
        return LeaseResult.written(self.seq)


def drive(m: LeaseMachine, kv: Kv, t: float, until: float, step: float = 0.1) -> float:
    while t < until:
        op = m.next_op(t)
        if op is not None:
            m.on_result(t, kv.apply(op, m.me))
        t = round(t + step, 6)
    return t


def test_the_token_grows_across_terms() -> None:
    """Gateways come and go on one key: each term's token exceeds every revision written before it."""
    kv = Kv()
    tokens: list[int] = []
    t = 0.0
    for n in range(6):
        m = machine(t, me=f"gw-{n}@h:{n}:00")
        t = drive(m, kv, t, t + T.ttl_s + 2 * T.renew_every_s)  # acquires or takes over, then renews
        assert m.may_act(t), n
        assert m.token > (tokens[-1] if tokens else 0)
        before = kv.last
        t = drive(m, kv, t, t + 3.0)
        assert kv.last > before  # renewed meanwhile: revisions moved on within the term
        tokens.append(m.token)
        if n % 2:
            m.release(t)  # a clean stop: the next one creates over the tombstone
            t = drive(m, kv, t, t + 0.5)
            assert kv.holder is None
        # else: crashed; the next one must wait out the TTL and take over
    assert tokens == sorted(set(tokens)) and len(tokens) == 6


def test_the_value_round_trips_and_garbage_is_no_lease() -> None:
    v = LeaseValue(holder=ME, instance="gw-a", host="h", pid=1, since="2026-01-01T00:00:00.000+00:00", term=10)
    assert decode_value(encode_value(v)) == v
    assert decode_value(b"not json") is None
    assert decode_value(b"[1, 2]") is None
