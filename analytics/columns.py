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
from collections.abc import Callable, Sequence
from typing import Any

import msgpack

from mavjet.contract.envelope import EnvelopeError, unpack

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
_N_BASE = len(BASE_COLUMNS)
_N_COLS = _N_BASE + _N_TYPED
_FAST_TYPE: dict[_Conv, type] = {_str: str, _float: float, _bool: bool}  # values already right as they are
# data key -> (position in the row, converter, the type that needs no conversion).
# Decoding walks the keys an event has (~10) instead of probing all 25
# columns' keys: this loop runs once per event in every partition and is
# most of a read's time.
_BY_KEY: dict[str, tuple[int, _Conv, type | None]] = {
    key: (_N_BASE + i, conv, _FAST_TYPE.get(conv)) for i, (key, conv) in enumerate(_TYPED)
}
assert len(_BY_KEY) == _N_TYPED, "each data key feeds one column"
_NO_TYPED: tuple[None, ...] = (None,) * _N_TYPED
_SUBJECT_CACHE_MAX = 100_000


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


def _envelope(payload: bytes) -> tuple[str, int, dict[str, Any]]:
    """(vid, time_ns, data) of an envelope, as `unpack` gives them, or EnvelopeError.

    The usual envelope is checked inline; anything else goes through
    `unpack`, so errors and edge cases are exactly the contract's; the
    usual one skips building a frozen dataclass per event.
    """
    try:
        obj = _unpackb(payload, raw=False, strict_map_key=False)
        if type(obj) is dict:
            ts, vid, data = obj.get("time"), obj.get("vid"), obj.get("data")
            if (
                type(ts) is msgpack.Timestamp
                and type(vid) is str
                and type(data) is dict
                and type(obj.get("v", 1)) is int
            ):
                return vid, ts.to_unix_nano(), data
    except Exception:  # unpack() below says what is wrong, in its own words
        pass
    env = unpack(payload)
    return env.vid, env.time_ns, env.data


_unpackb = msgpack.unpackb


class Columns:
    """Row accumulator with a column-wise view: rows are appended as lists
    (one list per event instead of 33 appends) and turned into columns when a
    batch is taken."""

    __slots__ = ("_subjects", "rows", "with_data")

    def __init__(self, *, with_data: bool = True) -> None:
        """`with_data=False` leaves the `data` JSON column null (and skips its
        JSON check): a reader that needs only the typed columns saves a third
        of the decoding."""
        self.rows: list[list[Any]] = []
        self.with_data = with_data
        # subject (as received) -> (subject, type, vid): ~15 types per vehicle, so few distinct ones
        self._subjects: dict[str | bytes, tuple[str, str | None, str | None]] = {}

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def cols(self) -> list[Sequence[Any]]:
        """The rows so far as one list per column (COLUMN_NAMES order)."""
        return _transpose(self.rows)

    def _subject(self, subject: str | bytes) -> tuple[str, str | None, str | None]:
        info = self._subjects.get(subject)
        if info is None:
            text = subject.decode("utf-8", "replace") if isinstance(subject, bytes) else subject
            info = (text, event_type(text), vid_of(text))
            if len(self._subjects) >= _SUBJECT_CACHE_MAX:
                self._subjects.clear()
            self._subjects[subject] = info
        return info

    def add(self, stream: str, seq: int, subject: str | bytes, payload: bytes) -> int | None:
        """Decode one message and append its row. Returns the event time in µs (None if unknown).

        `subject` may be the raw bytes off the wire (the reader's fast path)."""
        subj, etype, subject_vid = self._subject(subject)
        try:
            vid, time_ns, data = _envelope(payload)
        except EnvelopeError as exc:
            self.rows.append([stream, seq, subj, subject_vid, etype, None, None, str(exc), *_NO_TYPED])
            return None
        time_us = time_ns // 1000
        data_json: str | None = None
        err: str | None = None
        if self.with_data:
            try:
                data_json = json.dumps(data, default=_json_default, separators=(",", ":"))
            except (TypeError, ValueError) as exc:
                data_json, err = None, f"data not representable as JSON: {exc}"
        row: list[Any] = [stream, seq, subj, vid, etype, time_us, data_json, err, *_NO_TYPED]
        by_key = _BY_KEY
        for key, value in data.items():
            hit = by_key.get(key)
            if hit is not None and value is not None:
                pos, conv, fast = hit
                row[pos] = value if type(value) is fast else conv(value)
        self.rows.append(row)
        return time_us

    def take(self) -> list[Sequence[Any]]:
        rows, self.rows = self.rows, []
        return _transpose(rows)

    def truncate(self, n: int) -> None:
        """Drop rows from index n on (used to drop a row just appended)."""
        del self.rows[n:]


def _transpose(rows: list[list[Any]]) -> list[Sequence[Any]]:
    """Rows -> one tuple per column (what pa.array takes), in C: cheaper than 33 appends a row."""
    if not rows:
        return [() for _ in range(_N_COLS)]
    return list(zip(*rows))  # noqa: B905 (every row has _N_COLS items)
