"""Commands from a pull consumer as they come, with no exception when none comes.

An idle vehicle's loop waits for its next command in pull requests of
`fetch_timeout_s`. nats-py's `fetch(1, timeout)` ends every idle request in
a `TimeoutError` raised out of a per-call task, `wait_for` and cancellation:
~28 objects of cyclic garbage (tracebacks, frames, tasks) each time. At
1,000 vehicles and 5 s that is 200 a second; the objects outlive the young
collection while the request is open, and the older generation's collection
then freed ~125,000 of them at once, holding the event loop for ~250 ms
(measured in `mavjet bench mixed --vehicles 1000`): every command in flight
waited for it.

`PullOne` sends the pull request itself and reads the subscription's queue.
The server ends an idle request with a `408 Request Timeout` status message,
so the normal idle path returns `None` without raising. Only when the server
does not answer at all (connection lost, a stale subscription) does a local
deadline end the wait, also as `None`, and `answered` tells the two apart.

It reads nats-py's pull subscription through
`mavjet.contract.natsadapter.PullInternals` (its request subject, inbox and
queue). Without them, or on a nats-py version the adapter was not verified
against, it falls back to `fetch`, so a nats-py upgrade costs speed, never
correctness; tests/commands/test_pull.py watches the names.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import nats.errors
from nats.aio.msg import Msg
from nats.js.errors import APIError

from mavjet.contract.natsadapter import PullInternals

# The server's status codes on a pull request (ADR-13): heartbeat; no messages, request timeout, conflict.
_HEARTBEAT = "100"
_ENDED = frozenset({"404", "408", "409"})
_CONFLICT = "409"  # e.g. "Exceeded MaxWaiting": answered at once, so a loop would spin on it
CONFLICT_PAUSE_S = 0.1
# How long after its expiry the server's 408 may take before the request counts as unanswered.
ANSWER_GRACE_S = 2.0


class PullOne:
    """`next(expires_s)`: the consumer's next command, or `None` when the request ended without one.

    `batch` is how many commands one pull request asks for: 1 for a vehicle's
    own consumer (MaxAckPending 1), more for a gateway's consumer, whose
    commands are handed out one by one as they arrive while the request stays
    open until it has `batch` of them or expires.
    """

    def __init__(self, psub: Any, *, batch: int = 1) -> None:
        self.psub = psub
        self.batch = max(1, batch)
        self._internals = PullInternals.of(psub)
        self.fast = self._internals is not None
        self.answered = True  # False after a request the server never ended (see module docstring)
        self.conflicts = 0  # requests the server refused at once (409), each followed by a short pause
        self._owed = 0  # commands the open request may still bring (0: no request open)
        self._ends_at = 0.0  # monotonic time by which the server must have ended the open request

    async def next(self, expires_s: float) -> Msg | None:
        internals = self._internals
        if not self.fast or internals is None:
            return await self._fetch(expires_s)
        queue = internals.queue
        if not self._owed:
            while not queue.empty():  # leftovers: a late command of an unanswered request, or stale statuses
                msg = internals.taken(queue.get_nowait())
                if _status(msg) is None:
                    return msg
            expires_ns = int(expires_s * 1e9)
            await internals.request(json.dumps({"batch": self.batch, "expires": expires_ns}).encode())
            self._owed = self.batch
            self._ends_at = anyio.current_time() + expires_s + ANSWER_GRACE_S
            self.answered = False
        with anyio.move_on_after(max(0.0, self._ends_at - anyio.current_time())):
            while True:
                msg = internals.taken(await queue.get())
                status = _status(msg)
                if status is None:
                    self.answered = True
                    self._owed -= 1  # the request ends with its last command, without a status
                    return msg
                if status == _HEARTBEAT:
                    continue
                if status in _ENDED:
                    self.answered = True
                    self._owed = 0
                    if status == _CONFLICT:
                        self.conflicts += 1
                        await anyio.sleep(CONFLICT_PAUSE_S)
                    return None
                self._owed = 0
                raise APIError.from_msg(msg)
        self._owed = 0
        self.answered = False  # the server never ended the request
        return None

    async def _fetch(self, expires_s: float) -> Msg | None:
        try:
            msgs = await self.psub.fetch(1, timeout=expires_s)
        except nats.errors.TimeoutError:
            return None
        return msgs[0] if msgs else None


def _status(msg: Msg) -> str | None:
    """The status of a server's message on the request (heartbeat, 408, ...); None for a command."""
    return msg.headers.get("Status") if msg.headers else None
