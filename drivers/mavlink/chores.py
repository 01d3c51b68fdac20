"""Every link's periodic chores on one timer per event loop.

A link has three chores: the gateway's 1 Hz HEARTBEAT, the watchdog that
calls the link lost when the vehicle's heartbeats stop, and the check for
streams gone quiet. As three sleeping tasks a link they cost ~1.9 task
wake-ups a second, each a timer, a future and a task step: ~1,900 a second
at 1,000 vehicles. Without them the ingest benchmark's gateway took about a
tenth less CPU per MAVLink message (docs/performance.md). Here a link whose
transport can send without waiting hands its chores to the loop's `Chores`:
a heap of (due time, job) and one `call_later` for the earliest. A pass runs
every job that is due; `run(now)` does the job's work and returns when it is
next due (None: never again). Due times are rounded up to `GRANULARITY_S`,
so jobs due close together run in one pass. asyncio has no such wheel and
anyio has none either; ~100 lines here beat a dependency.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from typing import Protocol

import structlog

from mavjet.drivers.mavlink.perloop import PerLoop

log = structlog.get_logger("mavjet.link")

GRANULARITY_S = 0.01  # a job may run up to this much after its due time, with the others due then
RETRY_AFTER_S = 1.0  # a job that raised runs again after this


class Job(Protocol):
    def run(self, now: float) -> float | None:
        """Do what is due at `now` (time.monotonic); return when next due, or None to be dropped."""


class Chores(PerLoop):
    """The loop's timer for every link's chores. One per event loop (`for_loop`), dropped with its last job."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self._heap: list[tuple[float, int, Job]] = []
        self._seq = itertools.count()  # ties keep the order jobs were added in; jobs are never compared
        self._handle: asyncio.TimerHandle | None = None
        self._armed_for = math.inf  # the due time the handle fires for
        self.passes = 0  # for tests and diagnosis

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, job: Job, due: float) -> None:
        """Run `job` at `due` (time.monotonic) and then whenever it says."""
        due = _rounded(due)
        heapq.heappush(self._heap, (due, next(self._seq), job))
        if due < self._armed_for:
            self._arm(due)

    def _arm(self, due: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._armed_for = due
        self._handle = self._loop.call_later(max(0.0, due - time.monotonic()), self._fire)

    def _fire(self) -> None:
        self.passes += 1
        self._handle = None
        self._armed_for = math.inf
        heap = self._heap
        now = time.monotonic()
        while heap and heap[0][0] <= now:
            _, seq, job = heapq.heappop(heap)
            try:
                nxt = job.run(now)
            except Exception:  # one link's bug must not stop the other links' heartbeats
                log.exception("link_chore_failed")
                nxt = now + RETRY_AFTER_S
            if nxt is not None:
                heapq.heappush(heap, (_rounded(max(nxt, now + GRANULARITY_S)), seq, job))
        if heap:
            self._arm(heap[0][0])
        else:
            self.forget()


def _rounded(t: float) -> float:
    return math.ceil(t / GRANULARITY_S) * GRANULARITY_S
