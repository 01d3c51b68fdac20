"""The one bounded wait of the test suite: poll a predicate until it holds or the time is up."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio


class WaitTimeout(AssertionError, TimeoutError):
    """A wait ran out: a test failure (AssertionError) that `except TimeoutError` also catches."""


async def wait_for(
    pred: Callable[[], Any],
    timeout_s: float = 20.0,
    interval_s: float = 0.05,
    *,
    what: str = "condition",
    ignore: tuple[type[Exception], ...] = (),
) -> Any:
    """Poll `pred` until it returns something truthy (returned); WaitTimeout after `timeout_s`.

    Exceptions of the types in `ignore` count as "not yet" (e.g. OSError while a server starts).
    """

    async def call() -> Any:
        return pred()

    return await wait_for_async(call, timeout_s, interval_s, what=what, ignore=ignore)


async def wait_for_async(
    pred: Callable[[], Awaitable[Any]],
    timeout_s: float = 20.0,
    interval_s: float = 0.1,
    *,
    what: str = "condition",
    ignore: tuple[type[Exception], ...] = (),
) -> Any:
    """Like `wait_for` for a coroutine predicate; the failure shows the last value (or error) seen."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        try:
            last = await pred()
        except ignore as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() > deadline:
            raise WaitTimeout(f"{what} not met within {timeout_s}s (last: {last!r})")
        await anyio.sleep(interval_s)


__all__ = ["WaitTimeout", "wait_for", "wait_for_async"]
