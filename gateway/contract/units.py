"""Parsing of human durations and sizes used in definitions, config and CLI flags."""

from __future__ import annotations

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
