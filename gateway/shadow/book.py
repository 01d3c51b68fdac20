"""The one retry book every shadow step writes to.

Per path (`params.RTL_ALT`, `mission`, `mode`, ...) it keeps the failed
attempts for the current desired revision and when the next attempt is due
(capped exponential backoff), and the `DeltaBook` entry that ends up in
`reported.delta`. A pass starts with `begin_pass()`; every path a step
touches (`ok`, `note`, `waiting`, `fail`) is remembered, and `end_pass()`
drops the delta entries no step spoke about (a field removed from desired).

No I/O: `fail()` returns True when the path crossed the failure threshold
for this revision for the first time, and the caller emits `shadow_failed`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from mavjet.gateway.shadow.diff import DeltaBook, retry_delay_s

_EMITTED_MAX = 1024  # bound on the (revision, path) pairs remembered as already announced


class RetryBook:
    def __init__(self, *, retry_initial_s: float, retry_max_s: float, fail_after_attempts: int) -> None:
        self.retry_initial_s = retry_initial_s
        self.retry_max_s = retry_max_s
        self.fail_after_attempts = fail_after_attempts
        self.delta = DeltaBook()
        self.attempts: dict[str, int] = {}
        self.next_try_mono: dict[str, float] = {}
        self.touched: set[str] = set()
        self._failed_emitted: set[tuple[int, str]] = set()

    # -- a pass -----------------------------------------------------------------------
    def begin_pass(self) -> None:
        self.touched = set()

    def keep(self, paths: Iterable[str]) -> None:
        """Keep these paths' entries through `end_pass()` without touching them (link down)."""
        self.touched.update(paths)

    def end_pass(self) -> None:
        self.delta.retain(self.touched)

    def reset(self) -> None:
        """A new desired revision: every path starts again with no failed attempts."""
        self.attempts.clear()
        self.next_try_mono.clear()

    # -- per path ---------------------------------------------------------------------
    def due(self, path: str, now_mono: float | None = None) -> bool:
        now = time.monotonic() if now_mono is None else now_mono
        return now >= self.next_try_mono.get(path, 0.0)

    def next_due_mono(self) -> float | None:
        return min(self.next_try_mono.values()) if self.next_try_mono else None

    def ok(self, path: str) -> None:
        self.attempts.pop(path, None)
        self.next_try_mono.pop(path, None)
        self.delta.clear(path)
        self.touched.discard(path)

    def note(self, path: str, desired: Any, reported: Any, reason: str) -> None:
        """Not as desired, and nothing was attempted (validation, hold, waiting for a retry)."""
        self.touched.add(path)
        self.delta.set(path, desired=desired, reported=reported, reason=reason, now_s=time.time())

    def waiting(self, path: str, desired: Any, reported: Any) -> None:
        """Not as desired, and the next attempt is not due yet: keep the last reason."""
        cur = self.delta.entries.get(path)
        self.note(path, desired, reported, cur.reason if cur is not None else "waiting to retry")

    def fail(self, path: str, desired: Any, reported: Any, reason: str, *, revision: int,
             threshold: int | None = None, now_mono: float | None = None) -> bool:
        """An attempt failed: back off. True when `shadow_failed` is due for (revision, path)."""
        n = self.attempts.get(path, 0) + 1
        self.attempts[path] = n
        now = time.monotonic() if now_mono is None else now_mono
        self.next_try_mono[path] = now + retry_delay_s(n, self.retry_initial_s, self.retry_max_s)
        self.touched.add(path)
        self.delta.set(path, desired=desired, reported=reported, reason=reason, now_s=time.time(), attempts=n)
        if n < (threshold or self.fail_after_attempts) or (revision, path) in self._failed_emitted:
            return False
        if len(self._failed_emitted) >= _EMITTED_MAX:
            self._failed_emitted.clear()
        self._failed_emitted.add((revision, path))
        return True

    def give_up(self, path: str) -> None:
        """No further attempt is scheduled for this path (the caller's own cap was reached)."""
        self.next_try_mono.pop(path, None)
