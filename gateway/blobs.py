"""Plans (mission, fence, rally) from the TWIN_BLOBS object store: the one reader.

Commands (`mission_upload`) and the shadow (`desired.mission`) both name a
`.plan` object in TWIN_BLOBS. nats-py raises a wide range of exceptions on
the way (no connection, bucket or object missing, timeouts); this is the
boundary that translates them into `BlobError`, whose `kind` tells a caller
whether trying again later can help.
"""

from __future__ import annotations

from enum import StrEnum

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from drivers.mavlink.plan import Plan, parse_plan
from gateway.contract.errors import MavjetError
from gateway.contract.subjects import BLOBS_BUCKET


class BlobFailure(StrEnum):
    NOT_CONNECTED = "not_connected"  # no NATS connection: try again later
    NOT_FOUND = "not_found"  # the bucket or the object does not exist
    UNREADABLE = "unreadable"  # any other failure reading it (timeout, server error): try again later


class BlobError(MavjetError):
    """An object could not be read from TWIN_BLOBS; `error` and `detail` describe the cause."""

    def __init__(self, name: str, kind: BlobFailure, error: str = "", detail: str = "") -> None:
        super().__init__(f"{BLOBS_BUCKET} {name!r}: {kind.value} {error} {detail}".strip())
        self.name = name
        self.kind = kind
        self.error = error  # the underlying exception's type name ("" for NOT_CONNECTED)
        self.detail = detail  # its message


async def fetch_blob(js: JetStreamContext | None, name: str) -> bytes:
    """The object's bytes; raises BlobError."""
    if js is None:
        raise BlobError(name, BlobFailure.NOT_CONNECTED)
    try:
        store = await js.object_store(BLOBS_BUCKET)
        obj = await store.get(name)
    except Exception as exc:  # nats-py raises a wide range here; translated at this boundary
        kind = BlobFailure.NOT_FOUND if isinstance(exc, NotFoundError) else BlobFailure.UNREADABLE
        raise BlobError(name, kind, type(exc).__name__, str(exc)) from exc
    return obj.data or b""


async def fetch_plan(js: JetStreamContext | None, name: str) -> Plan:
    """The parsed `.plan` object; raises BlobError, or PlanError when it is not a valid plan."""
    return parse_plan(await fetch_blob(js, name))
