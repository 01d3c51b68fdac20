"""The msgpack envelope every stream message carries (docs/design.md, Payloads).

`{"v": 1, "vid": str, "time": <msgpack Timestamp, UTC>, "data": {...}}`
with header `Content-Type: application/msgpack`. Pure functions, no I/O.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import msgpack

from mavjet.contract.errors import MavjetError

CONTENT_TYPE = "application/msgpack"
HEADERS = {"Content-Type": CONTENT_TYPE}
VERSION = 1


class EnvelopeError(MavjetError):
    """A payload is not a valid mavjet envelope."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"bad envelope: {reason}")
        self.reason = reason


@dataclass(frozen=True, slots=True, kw_only=True)
class Envelope:
    vid: str
    time_ns: int
    data: dict[str, Any]
    v: int = VERSION

    @property
    def time(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.time_ns / 1e9, tz=dt.UTC)


def pack(vid: str, time_ns: int, data: dict[str, Any]) -> bytes:
    """Encode an envelope. `time_ns` is UTC nanoseconds since the epoch."""
    return msgpack.packb(
        {"v": VERSION, "vid": vid, "time": msgpack.Timestamp.from_unix_nano(time_ns), "data": data},
        use_bin_type=True,
    )


def unpack(payload: bytes) -> Envelope:
    """Decode an envelope, raising EnvelopeError with the reason if it is not one."""
    try:
        obj = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise EnvelopeError(f"not msgpack ({exc})") from exc
    if not isinstance(obj, dict):
        raise EnvelopeError(f"top level is {type(obj).__name__}, not a map")
    ts = obj.get("time")
    if not isinstance(ts, msgpack.Timestamp):
        raise EnvelopeError("'time' is missing or not a msgpack Timestamp")
    vid = obj.get("vid")
    data = obj.get("data")
    if not isinstance(vid, str) or not isinstance(data, dict):
        raise EnvelopeError("'vid' must be a string and 'data' a map")
    v = obj.get("v", VERSION)
    return Envelope(vid=vid, time_ns=ts.to_unix_nano(), data=data, v=int(v))
