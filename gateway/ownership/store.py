"""The lease bucket (TWIN_LEASES) over JetStream: get, compare-and-set write, compare-and-set delete.

Not nats-py's `KeyValue`, for three reasons: every operation here carries
its own timeout (a renew must fail in well under a renew period, not after
the JetStream context's default), binding a `KeyValue` costs a stream info
request per (re)connect, and a credential limited to its own vehicles needs
a get whose subject names the key (a direct get; the leader's
`STREAM.MSG.GET` names only the stream). A direct get may be answered by a
replica that lags and shows an older revision: that is *safe* (every
decision to act rests on a compare-and-set write, which only the leader with
a quorum commits); it can only make a standby try a takeover that fails.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext

from mavjet.contract.errors import MavjetError
from mavjet.contract.natsadapter import put_subject
from mavjet.contract.subjects import LEASES_BUCKET, LEASES_STREAM, lease_kv_subject

__all__ = ["JetStreamLeaseStore", "LeaseConflict", "LeaseEntry", "LeaseError", "LeaseStore", "LeaseUnavailable"]

_EXPECTED_LAST = "Nats-Expected-Last-Subject-Sequence"
_KV_OP = "KV-Operation"
_DELETED = ("DEL", "PURGE")
# JSStreamWrongLastSequenceErrF and its constant twin: the compare-and-set lost.
_WRONG_LAST = (10071, 10164)


class LeaseError(MavjetError):
    """A lease operation did not succeed; `key` names the lease."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"lease {key}: {reason}")
        self.key = key
        self.reason = reason


class LeaseConflict(LeaseError):
    """The key's last revision was not the expected one: someone else wrote it."""


class LeaseUnavailable(LeaseError):
    """No answer (timeout, no connection, no bucket): whether the operation happened is unknown."""


@dataclass(frozen=True, slots=True)
class LeaseEntry:
    revision: int  # the key's last revision (a tombstone's when deleted; 0: never written)
    value: bytes | None  # None: absent or deleted


class LeaseStore(Protocol):
    """The KV seam of the keeper: what it needs of a bucket, nothing more."""

    async def get(self, key: str) -> LeaseEntry:
        """The key's newest entry (raise LeaseUnavailable)."""

    async def write(self, key: str, value: bytes, *, last: int) -> int:
        """Store `value` if the key's last revision is `last` (0: no entry); the new revision.

        Raise LeaseConflict or LeaseUnavailable.
        """

    async def delete(self, key: str, *, last: int) -> int:
        """Put a delete marker if the key's last revision is `last`; the marker's revision."""


class JetStreamLeaseStore:
    """TWIN_LEASES through a JetStream context the caller owns (`js()` None: not connected)."""

    def __init__(self, js: Callable[[], JetStreamContext | None], *, timeout_s: float = 0.75,
                 bucket: str = LEASES_BUCKET) -> None:
        self._js = js
        self.timeout_s = timeout_s
        self.bucket = bucket
        self.stream = LEASES_STREAM if bucket == LEASES_BUCKET else f"KV_{bucket}"

    def _subject(self, key: str) -> str:
        return lease_kv_subject(key) if self.bucket == LEASES_BUCKET else f"$KV.{self.bucket}.{key}"

    def _context(self, key: str) -> JetStreamContext:
        js = self._js()
        if js is None:
            raise LeaseUnavailable(key, "not connected to NATS")
        return js

    async def get(self, key: str) -> LeaseEntry:
        js = self._context(key)
        try:
            try:
                # The direct get names the key in its subject, so a credential can be limited to its
                # own vehicles' leases (ops/auth.py); any replica may answer (see the module docstring).
                msg = await js.get_msg(self.stream, subject=self._subject(key), direct=True)
            except nats.errors.NoRespondersError:
                # A bucket provisioned before direct gets were on: the leader's get, unfiltered.
                msg = await js.get_msg(self.stream, subject=self._subject(key), direct=False)
        except nats.js.errors.NotFoundError as exc:
            if getattr(exc, "err_code", None) == 10059:  # stream not found
                raise LeaseUnavailable(key, f"bucket {self.bucket} missing: run `mavjet provision`") from exc
            return LeaseEntry(0, None)
        except (nats.errors.Error, TimeoutError, OSError) as exc:
            raise LeaseUnavailable(key, f"{type(exc).__name__}: {exc}") from exc
        op = (msg.headers or {}).get(_KV_OP)
        return LeaseEntry(int(msg.seq or 0), None if op in _DELETED else (msg.data or b""))

    async def write(self, key: str, value: bytes, *, last: int) -> int:
        return await self._publish(key, value, {_EXPECTED_LAST: str(last)})

    async def delete(self, key: str, *, last: int) -> int:
        return await self._publish(key, b"", {_EXPECTED_LAST: str(last), _KV_OP: "DEL"})

    async def put(self, key: str, value: bytes) -> int:
        """Store `value` whatever the key holds: for a key only this process writes (a presence record)."""
        return await self._publish(key, value, {})

    async def remove(self, key: str) -> int:
        """A delete marker whatever the key holds (a presence record on a clean stop or on becoming owner)."""
        return await self._publish(key, b"", {_KV_OP: "DEL"})

    async def _publish(self, key: str, payload: bytes, headers: dict[str, str]) -> int:
        js = self._context(key)
        try:
            # Across a JetStream domain (a companion naming the hub's) a KV write needs the domain's prefix.
            ack = await js.publish(put_subject(js, self._subject(key)), payload, timeout=self.timeout_s,
                                   headers=headers or None)
        except nats.js.errors.APIError as exc:
            if exc.err_code in _WRONG_LAST:
                raise LeaseConflict(key, exc.description or "wrong last revision") from exc
            raise LeaseUnavailable(key, f"{type(exc).__name__}: {exc}") from exc
        except (nats.errors.Error, TimeoutError, OSError) as exc:
            raise LeaseUnavailable(key, f"{type(exc).__name__}: {exc}") from exc
        return int(ack.seq)
