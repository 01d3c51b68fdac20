"""Allowed / refused checks against a server enforcing the generated permissions."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client

from tests.support.wait import wait_for

# Refused JetStream requests get no answer: a short timeout keeps the suite quick.
JS_TIMEOUT_S = 1.0


def violations(nc: Client) -> list[str]:
    errors: list[Exception] = nc._mavjet_errors  # type: ignore[attr-defined]
    return [str(e).lower() for e in errors if "permissions violation" in str(e).lower()]


async def refused(nc: Client, subject: str, action: Callable[[], Awaitable[Any]]) -> None:
    """`action` fails or goes unanswered, and the server reports a permissions violation on `subject`."""
    before = len(violations(nc))
    try:
        await action()
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError, nats.js.errors.Error, TimeoutError):
        pass
    else:
        # A plain publish returns at once; the violation arrives asynchronously.
        pass
    await nc.flush()
    want = subject.lower()
    await wait_for(lambda: any(want in v for v in violations(nc)[before:]), timeout_s=5)


def clean(nc: Client) -> None:
    assert violations(nc) == [], violations(nc)
