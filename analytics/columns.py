"""The row schema of the `jetstream` data source and the pure decoder behind it.

One function turns a stored message (stream, seq, subject, payload) into a
row: envelope fields, the event `data` as a JSON string, and typed columns for
the fields analytics uses most (docs/events.md), so jobs never parse JSON and
msgpack is decoded exactly once, in the reader. A message that is not a valid
envelope becomes a row with `error` set instead of failing the job.

No Spark, no NATS here: columns are accumulated into plain lists and turned
into a pyarrow batch by the caller.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import msgpack

from gateway.contract.envelope import EnvelopeError, unpack

# (column, Spark SQL type, key in the event's data map, converter)
# Order matters: it is the column order of every DataFrame the source returns.
_Conv = Callable[[Any], Any]


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else (None if v is None else str(v))


def _float(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v)


def _int(v: Any) -> int | None:
    if isinstance(v, bool) or not isinstance(v, int):
        return None
    return v if -(2**31) <= v < 2**31 else None


def _bool(v: Any) -> bool | None:
    return v if isinstance(v, bool) else None


BASE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("stream", "string"),
    ("seq", "bigint"),
    ("subject", "string"),
    ("vid", "string"),
    ("type", "string"),
    ("time", "timestamp"),
    ("data", "string"),
    ("error", "string"),
)

TYPED_COLUMNS: tuple[tuple[str, str, str, _Conv], ...] = (
    # vehicle snapshot carried by every event
    ("mode", "string", "mode", _str),
    ("armed", "boolean", "armed", _bool),
    ("lat_deg", "double", "lat_deg", _float),
    ("lon_deg", "double", "lon_deg", _float),
    ("alt_m", "double", "alt_m", _float),
    ("alt_msl_m", "double", "alt_msl_m", _float),
    ("battery_pct", "double", "battery_pct", _float),
    ("flavour", "string", "flavour", _str),
    # type-specific
    ("previous_mode", "string", "previous_mode", _str),
    ("max_alt_m", "double", "max_alt_m", _float),
    ("distance_m", "double", "distance_m", _float),
    ("battery_used_pct", "double", "battery_used_pct", _float),
    ("flight_s", "double", "flight_s", _float),
    ("failsafe_type", "string", "failsafe_type", _str),
    ("action_taken", "string", "action_taken", _str),
    ("severity", "int", "severity", _int),
    ("text", "string", "text", _str),
    ("mission_seq", "int", "seq", _int),
    ("cmd_id", "string", "cmd_id", _str),
    ("cmd_name", "string", "name", _str),
    ("result", "string", "result", _str),
    ("mav_result", "int", "mav_result", _int),
    ("attempts", "int", "attempts", _int),
    ("latency_ms", "double", "latency_ms", _float),
    ("outage_s", "double", "outage_s", _float),
)

COLUMN_NAMES: tuple[str, ...] = tuple(c for c, _ in BASE_COLUMNS) + tuple(c for c, *_ in TYPED_COLUMNS)

SCHEMA_DDL = ", ".join(
    [f"{name} {typ}" for name, typ in BASE_COLUMNS] + [f"{name} {typ}" for name, typ, _, _ in TYPED_COLUMNS]
)

_TYPED = tuple((key, conv) for _, _, key, conv in TYPED_COLUMNS)
_N_TYPED = len(_TYPED)
# data key -> (position among the typed columns, converter). Decoding walks
# the keys an event has (~10) instead of probing all 25 columns' keys: this
# loop runs once per event in every partition and is most of a read's time.
_BY_KEY: dict[str, tuple[int, _Conv]] = {key: (i, conv) for i, (key, conv) in enumerate(_TYPED)}
assert len(_BY_KEY) == _N_TYPED, "each data key feeds one column"


def _json_default(v: Any) -> Any:
    if isinstance(v, msgpack.Timestamp):
        return v.to_datetime().isoformat()
    if isinstance(v, bytes):
        return v.hex()
    return str(v)


def event_type(subject: str) -> str | None:
    """`fleet.<env>.veh.<vid>.evt.<type>` -> type; None for other subjects."""
    parts = subject.split(".", 5)
    if len(parts) == 6 and parts[4] == "evt":
        return parts[5]
    return None


def vid_of(subject: str) -> str | None:
    parts = subject.split(".", 4)
    return parts[3] if len(parts) >= 4 and parts[0] == "fleet" else None


class Columns:
    """Column-wise accumulator: one list per column, appended row by row."""

    __slots__ = ("cols", "with_data")

    def __init__(self, *, with_data: bool = True) -> None:
        """`with_data=False` leaves the `data` JSON column null (and skips its
        JSON check): a reader that needs only the typed columns saves a third
        of the decoding."""
        self.cols: list[list[Any]] = [[] for _ in COLUMN_NAMES]
        self.with_data = with_data

    def __len__(self) -> int:
        return len(self.cols[0])

    def add(self, stream: str, seq: int, subject: str, payload: bytes) -> int | None:
        """Decode one message and append its row. Returns the event time in µs (None if unknown)."""
        c = self.cols
        row_vid: str | None
        time_us: int | None
        err: str | None
        data_json: str | None = None
        try:
            env = unpack(payload)
        except EnvelopeError as exc:
            row_vid, time_us, err = vid_of(subject), None, str(exc)
            typed: list[Any] = [None] * _N_TYPED
        else:
            data = env.data
            row_vid, time_us, err = env.vid, env.time_ns // 1000, None
            if self.with_data:
                try:
                    data_json = json.dumps(data, default=_json_default, separators=(",", ":"))
                except (TypeError, ValueError) as exc:
                    data_json, err = None, f"data not representable as JSON: {exc}"
            typed = [None] * _N_TYPED
            by_key = _BY_KEY
            for key, value in data.items():
                hit = by_key.get(key)
                if hit is not None and value is not None:
                    typed[hit[0]] = hit[1](value)
        c[0].append(stream)
        c[1].append(seq)
        c[2].append(subject)
        c[3].append(row_vid)
        c[4].append(event_type(subject))
        c[5].append(time_us)
        c[6].append(data_json)
        c[7].append(err)
        for i, v in enumerate(typed, 8):
            c[i].append(v)
        return time_us

    def take(self) -> list[list[Any]]:
        cols, self.cols = self.cols, [[] for _ in COLUMN_NAMES]
        return cols

    def truncate(self, n: int) -> None:
        """Drop rows from index n on (used to drop a row just appended)."""
        for col in self.cols:
            del col[n:]
