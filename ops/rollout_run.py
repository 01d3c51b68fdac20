"""Driving a rollout: observe, `advance`, write, publish, store; and stopping or undoing one.

The loop is the only place that waits. Each pass reads the stored document's
revision back before it writes any vehicle's desired, so an `abort` from
another process stops the writes at the next pass (at most one pass of
writes can race it, and those vehicles are in the document that process
stores, which the abort's re-read then sees: `rollback` after `abort` covers
them).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import anyio

from mavjet.contract.events import EventType
from mavjet.ops.rollout_plan import (
    FINISHED_STEPS,
    Rollout,
    RolloutError,
    RolloutStatus,
    Step,
    VehicleRun,
    advance,
    rolled_back,
    stop,
    to_roll_back,
    write_failed,
    written,
)
from mavjet.ops.rollout_store import RolloutConflict, RolloutStore

ProgressFn = Callable[[Rollout], None]
_WRITE_CONCURRENCY = 16  # desired writes in flight at once in a wave
_SAVE_ATTEMPTS = 5  # an abort racing the driver's save: re-read and apply again, this many times


def _active(r: Rollout) -> list[str]:
    """The vehicles the next pass needs observed: the current wave's, unfinished (the next wave's start next pass)."""
    return [v.vid for v in r.vehicles.values() if v.wave == r.wave and v.step not in FINISHED_STEPS]


def max_passes(r: Rollout, tick_s: float) -> int:
    """A bound on the loop: every wave waiting out both deadlines, twice over, plus slack."""
    per_wave_s = r.settings.disarm_timeout_s + r.settings.converge_timeout_s
    return int(2 * len(r.waves) * per_wave_s / max(tick_s, 0.01)) + 100


async def drive(store: RolloutStore, rollout_id: str, *, tick_s: float = 1.0,
                progress: ProgressFn | None = None) -> Rollout:
    """Run the stored rollout until it is no longer RUNNING (done, halted, or stopped by another process)."""
    r, rev = await store.load(rollout_id)
    for _ in range(max_passes(r, tick_s)):
        if r.status is not RolloutStatus.RUNNING:
            break
        now_s = time.time()
        obs = await store.observe(_active(r))
        step = advance(r, obs, now_s)
        nxt = step.rollout
        finished: list[VehicleRun] = list(step.finished)
        if step.write:
            _, stored_rev = await store.load(rollout_id)
            if stored_rev != rev:  # an abort (or another driver) got there first: write nothing
                return (await store.load(rollout_id))[0]
            nxt, failed = await _write_all(store, nxt, step.write)
            finished += failed
        await _publish(store, r, nxt, finished, step.waves_done)
        try:
            rev = await store.save(nxt, rev)
        except RolloutConflict:
            cur, _ = await store.load(rollout_id)
            if cur.status is RolloutStatus.RUNNING:
                raise
            return cur  # stopped by another process: its document is the truth
        r = nxt
        if progress is not None:
            progress(r)
        if r.status is RolloutStatus.RUNNING:
            await anyio.sleep(tick_s)
    else:
        raise RolloutError(f"rollout {rollout_id} did not finish within its deadlines' bound; `resume` goes on")
    return r


async def _write_all(store: RolloutStore, r: Rollout, vids: Sequence[str]) -> tuple[Rollout, list[VehicleRun]]:
    outcomes = {}
    limit = anyio.Semaphore(_WRITE_CONCURRENCY)

    async def one(vid: str) -> None:
        async with limit:
            outcomes[vid] = await store.write_desired(r, vid)

    async with anyio.create_task_group() as tg:
        for vid in vids:
            tg.start_soon(one, vid)
    failed: list[VehicleRun] = []
    now_s = time.time()
    for vid in vids:
        o = outcomes[vid]
        if o.failure is not None:
            r = write_failed(r, vid, o.failure, o.detail, now_s)
            failed.append(r.vehicles[vid])
        else:
            r = written(r, vid, revision=o.revision, previous_revision=o.previous_revision, now_s=now_s)
    return r, failed


async def _publish(store: RolloutStore, before: Rollout, r: Rollout, finished: Sequence[VehicleRun],
                   waves_done: Sequence[int]) -> None:
    """The events of one pass, before the pass is stored: a resumed pass re-publishes them, de-duplicated."""
    for v in finished:
        await store.vehicle_event(r, v.vid, wave=v.wave + 1, result=v.step.value,
                                  failure=None if v.failure is None else v.failure.value, detail=v.detail,
                                  desired_revision=v.revision or None)
    for w in waves_done:
        vs = r.in_wave(w)
        await store.fleet_event(r, EventType.ROLLOUT_WAVE, f"w{w + 1}", wave=w + 1, waves=len(r.waves),
                                vehicles=len(vs), converged=sum(v.step is Step.CONVERGED for v in vs),
                                failed=sum(v.step is Step.FAILED for v in vs))
    if before.status is RolloutStatus.RUNNING and r.status is RolloutStatus.HALTED:
        await store.fleet_event(r, EventType.ROLLOUT_HALTED, f"h{r.failures()}", wave=r.wave + 1,
                                failed=r.failures(), reason=r.reason)
    if r.status is RolloutStatus.DONE:
        conv = sum(v.step is Step.CONVERGED for v in r.vehicles.values())
        await store.fleet_event(r, EventType.ROLLOUT_DONE, "done", converged=conv, failed=r.failures(),
                                duration_s=round(r.updated_s - r.created_s, 3))


async def change_status(store: RolloutStore, rollout_id: str, apply: Callable[[Rollout], Rollout]) -> Rollout:
    """Load, apply, store with the revision read; on a race with a driver's save, again (bounded)."""
    for _ in range(_SAVE_ATTEMPTS):
        r, rev = await store.load(rollout_id)
        new = apply(r)
        if new is r:
            return r
        try:
            await store.save(new, rev)
            return new
        except RolloutConflict:
            await anyio.sleep(0.1)
    raise RolloutConflict(f"rollout {rollout_id} kept changing; try again")


async def abort(store: RolloutStore, rollout_id: str, reason: str) -> Rollout:
    def apply(r: Rollout) -> Rollout:
        if r.status in (RolloutStatus.ABORTED, RolloutStatus.ROLLED_BACK, RolloutStatus.DONE):
            return r
        return stop(r, RolloutStatus.ABORTED, reason, time.time())

    r = await change_status(store, rollout_id, apply)
    if r.status is RolloutStatus.ABORTED:
        await store.fleet_event(r, EventType.ROLLOUT_ABORTED, "abort", wave=min(r.wave + 1, len(r.waves)),
                                reason=r.reason)
    return r


async def rollback(store: RolloutStore, rollout_id: str, reason: str = "rolled back by an operator") -> Rollout:
    """Stop the rollout (if running) and restore each written vehicle's previous desired, where still ours."""
    r = await abort(store, rollout_id, reason)
    restored: dict[str, str] = {}
    kept: dict[str, str] = {}
    for v in to_roll_back(r):
        if v.revision == v.previous_revision:
            restored[v.vid] = "nothing to restore (desired already had the change)"
            continue
        ok, detail = await store.restore(r, v.vid, v.revision)
        (restored if ok else kept)[v.vid] = detail

    def apply(cur: Rollout) -> Rollout:
        now_s = time.time()
        for vid, detail in restored.items():
            cur = rolled_back(cur, vid, detail, now_s)
        for vid, detail in kept.items():  # someone changed desired since: theirs stands, the reason is kept
            cur = replace(cur, vehicles={**cur.vehicles, vid: replace(cur.vehicles[vid], detail=detail)})
        return stop(cur, RolloutStatus.ROLLED_BACK, reason, now_s)

    r = await change_status(store, rollout_id, apply)
    for vid in restored:
        v = r.vehicles[vid]
        await store.vehicle_event(r, vid, wave=v.wave + 1, result=Step.ROLLED_BACK.value, failure=None,
                                  detail=v.detail, desired_revision=v.revision)
    await store.fleet_event(r, EventType.ROLLOUT_ROLLED_BACK, "rollback", restored=len(restored), kept=len(kept))
    return r
