"""Parsing of human durations and sizes used in definitions, config and CLI flags."""

from __future__ import annotations

import datetime as dt
import math
import re

_DUR = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_DUR_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def parse_duration_s(value: str | float | int) -> float:
    """'90d', '5m', '1.5s', '250ms' or a number of seconds -> seconds."""
    if isinstance(value, int | float):
        return float(value)
    m = _DUR.match(value)
    if not m:
        raise ValueError(f"{value!r} is not a duration like 500ms, 30s, 5m, 1h or 90d")
    return float(m.group(1)) * _DUR_UNITS[m.group(2)]


def parse_size_bytes(value: str | int) -> int:
    """'128KB', '10GB', '1MiB' or a number of bytes -> bytes (powers of 1024, as nats-server)."""
    if isinstance(value, int):
        return value
    m = _SIZE.match(value)
    if not m:
        raise ValueError(f"{value!r} is not a size like 128KB, 1MB or 10GB")
    unit = (m.group(2) or "").upper()[:1]
    return int(float(m.group(1)) * _SIZE_UNITS[unit])


_AGO = re.compile(r"^\s*(.+?)\s+ago\s*$")


def parse_instant(value: str, *, now: dt.datetime | None = None) -> dt.datetime:
    """A point in time, UTC, from what people type on a command line.

    `now`; `today` / `yesterday` (00:00 UTC); a duration meaning that long
    ago (`10m`, `24h`, `7d`, `90s ago`); an ISO 8601 time
    (`2026-11-20T10:00`, `2026-11-20`; naive means UTC); or epoch seconds.
    Raises ValueError with the accepted forms.
    """
    now = now or dt.datetime.now(dt.UTC)
    v = value.strip().lower()
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if v == "now":
        return now
    if v == "today":
        return midnight
    if v == "yesterday":
        return midnight - dt.timedelta(days=1)
    if re.fullmatch(r"\d{9,}(\.\d+)?", v):  # epoch seconds (a duration that long would be 30+ years)
        return dt.datetime.fromtimestamp(float(v), tz=dt.UTC)
    m = _AGO.match(v)
    if m or _DUR.match(v):
        try:
            return now - dt.timedelta(seconds=parse_duration_s(m.group(1) if m else v))
        except ValueError:
            pass
    try:
        t = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{value!r} is not a time: use now, today, yesterday, a duration ago (10m, 24h, 7d), "
            "an ISO 8601 time (2026-11-20T10:00, UTC unless an offset is given) or epoch seconds"
        ) from None
    return t if t.tzinfo is not None else t.replace(tzinfo=dt.UTC)


def haversine_m(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """Great-circle distance in metres (mean Earth radius): the gateway's flight distance, synth's tracks."""
    r = 6_371_000.0
    p1, p2 = math.radians(lat1), math.radians(lat2)
    dp, dl = p2 - p1, math.radians(lon2 - lon1)
    a = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return 2 * r * math.asin(min(1.0, math.sqrt(a)))
