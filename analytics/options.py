"""Options of the `jetstream` data source: parsed from Spark's string map, validated.

Spark hands a data source its options as a case-insensitive map of strings,
and the reader object travels by pickle to every Python worker, so everything
here stays plain (strings, ints, tuples). Parsing is pure and unit-tested.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import dataclass

from mavjet.contract.errors import ConfigError
from mavjet.contract.natsconn import DEFAULT_NATS, check_url, with_scheme
from mavjet.contract.subjects import EVENTS_STREAM
from mavjet.contract.units import parse_duration_s

DEFAULT_BATCH_ROWS = 20_000
DEFAULT_ROWS_PER_PARTITION = 250_000
MAX_PARTITIONS = 512


def parse_time_us(value: str, *, key: str) -> int:
    """ISO 8601 (`2025-06-01T12:00:00Z`, naive means UTC) or epoch seconds -> µs since the epoch."""
    v = value.strip()
    try:
        return round(float(v) * 1_000_000)
    except ValueError:
        pass
    try:
        t = dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ConfigError(key, f"{value!r} is not an ISO 8601 time or epoch seconds") from exc
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    delta = t - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def format_time_us(us: int) -> str:
    return (dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=us)).isoformat()


def _opt_bool(raw: Mapping[str, str], key: str, *, default: bool) -> bool:
    v = raw.get(key)
    if v is None or v == "":
        return default
    if v.lower() in ("true", "1", "yes"):
        return True
    if v.lower() in ("false", "0", "no"):
        return False
    raise ConfigError(key, f"{v!r} is not true or false")


def _opt_int(raw: Mapping[str, str], key: str, *, minimum: int) -> int | None:
    v = raw.get(key)
    if v is None or str(v).strip() == "":
        return None
    try:
        n = int(str(v))
    except ValueError as exc:
        raise ConfigError(key, f"{v!r} is not an integer") from exc
    if n < minimum:
        raise ConfigError(key, f"must be >= {minimum}, got {n}")
    return n


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceOptions:
    """What to read. Sequences are inclusive; times filter on the envelope `time`
    (when the event happened) and are half-open: start <= time < end."""

    url: str = DEFAULT_NATS
    stream: str = EVENTS_STREAM
    subjects: tuple[str, ...] = ()
    start_seq: int | None = None
    end_seq: int | None = None
    start_time_us: int | None = None
    end_time_us: int | None = None
    partitions: int | None = None
    creds: str | None = None
    batch_rows: int = DEFAULT_BATCH_ROWS
    # Events reach the stream after they happen (spooled while offline, or a
    # history imported later), so by default the read runs to the stream's end
    # and end_time is applied per row. With `lateness` set, the read stops at
    # the first message stored that long after end_time (faster, but drops
    # events that arrived later than that).
    lateness_s: float | None = None
    timeout_s: float = 30.0
    # False: leave the `data` JSON column null (the typed columns are still
    # decoded); a third less decoding for readers that drop it anyway.
    data: bool = True
    # streaming only
    starting: str = "earliest"
    max_events_per_trigger: int | None = None

    def __post_init__(self) -> None:
        if not self.servers:
            raise ConfigError("url", f"{self.url!r} is not a NATS URL like nats://host:4222 (or host:4222)")
        for url in self.servers:
            try:
                check_url(url)
            except ConfigError as exc:
                raise ConfigError("url", f"{exc.reason} (nats://host:4222 or host:4222)") from None
        if not self.stream:
            raise ConfigError("stream", "a stream name is required")
        if self.start_seq is not None and self.end_seq is not None and self.end_seq < self.start_seq:
            raise ConfigError("end_seq", "end_seq is before start_seq")
        if (
            self.start_time_us is not None
            and self.end_time_us is not None
            and self.end_time_us <= self.start_time_us
        ):
            raise ConfigError("end_time", "end_time must be after start_time")
        if self.partitions is not None and not 1 <= self.partitions <= MAX_PARTITIONS:
            raise ConfigError("partitions", f"must be 1..{MAX_PARTITIONS}")
        if self.batch_rows < 1:
            raise ConfigError("batch_rows", "must be >= 1")
        if self.starting not in ("earliest", "latest"):
            raise ConfigError("starting", "must be 'earliest' or 'latest'")
        if self.timeout_s <= 0 or (self.lateness_s is not None and self.lateness_s < 0):
            raise ConfigError("timeout", "timeout must be > 0 and lateness >= 0")

    @classmethod
    def from_options(cls, raw: Mapping[str, str]) -> SourceOptions:
        """Build from Spark's option map (keys are lower-cased by Spark)."""
        low = {str(k).lower(): str(v) for k, v in raw.items() if v is not None}
        subjects = tuple(s.strip() for s in low.get("subjects", "").split(",") if s.strip())
        start_t = low.get("start_time")
        end_t = low.get("end_time")
        try:
            lateness_s = parse_duration_s(low["lateness"]) if low.get("lateness") else None
            timeout_s = parse_duration_s(low.get("timeout", "30s"))
        except ValueError as exc:
            raise ConfigError("lateness/timeout", str(exc)) from exc
        return cls(
            url=low.get("url", DEFAULT_NATS),
            stream=low.get("stream", EVENTS_STREAM),
            subjects=subjects,
            start_seq=_opt_int(low, "start_seq", minimum=1),
            end_seq=_opt_int(low, "end_seq", minimum=1),
            start_time_us=parse_time_us(start_t, key="start_time") if start_t else None,
            end_time_us=parse_time_us(end_t, key="end_time") if end_t else None,
            partitions=_opt_int(low, "partitions", minimum=1),
            creds=low.get("creds") or None,
            batch_rows=_opt_int(low, "batch_rows", minimum=1) or DEFAULT_BATCH_ROWS,
            lateness_s=lateness_s,
            timeout_s=timeout_s,
            data=_opt_bool(low, "data", default=True),
            starting=low.get("starting", "earliest"),
            max_events_per_trigger=_opt_int(low, "max_events_per_trigger", minimum=1),
        )

    @property
    def servers(self) -> list[str]:
        """The URLs, `host:port` taken as the nats CLI takes it (nats://host:port)."""
        return [with_scheme(s.strip()) for s in self.url.split(",") if s.strip()]


def plan_ranges(first: int, last: int, partitions: int | None) -> list[tuple[int, int]]:
    """Split the inclusive sequence range [first, last] into contiguous ranges.

    Without an explicit count: one range per 250k sequences, at least two when
    there is enough to share so both cores of a laptop read.
    """
    if last < first:
        return []
    span = last - first + 1
    if partitions is None:
        partitions = math.ceil(span / DEFAULT_ROWS_PER_PARTITION)
        if span >= 2_000:
            partitions = max(partitions, 2)
    n = max(1, min(partitions, span, MAX_PARTITIONS))
    step, extra = divmod(span, n)
    out: list[tuple[int, int]] = []
    lo = first
    for i in range(n):
        hi = lo + step - 1 + (1 if i < extra else 0)
        out.append((lo, hi))
        lo = hi + 1
    return out
