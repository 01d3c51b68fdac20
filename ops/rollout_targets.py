"""`mavjet rollout`'s inputs, pure: the target set from ids or tags, the waves, the threshold, the change.

`tag_view` is what a selector matches: the gateway's `meta` scalars with the
operator's tags (TWIN_ROLLOUTS `fleet.<env>.veh.<vid>.tags`) over them
(docs/rollout.md, Targets). `apply_change` merges the change into one
vehicle's desired as `mavjet shadow set` would.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from mavjet.ops.rollout_plan import RolloutError
from mavjet.ops.shadow import set_paths

# -- targets ----------------------------------------------------------------------------------

_TAG = re.compile(r"^[A-Za-z0-9_.\-]+$")


def parse_selector(text: str) -> dict[str, str]:
    """`type=quad,site=north` -> {"type": "quad", "site": "north"} (every pair must match)."""
    out: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not _TAG.match(key) or not value:
            raise RolloutError(f"selector {part!r}: expected KEY=VALUE[,KEY=VALUE...], e.g. type=quad,site=north")
        out[key] = value
    if not out:
        raise RolloutError("empty selector: give KEY=VALUE pairs, e.g. --select type=quad,site=north")
    return out


def tag_view(meta: Mapping[str, Any] | None, tags: Mapping[str, Any] | None) -> dict[str, str]:
    """What a selector matches: the gateway's `meta` scalars (type, flavour, firmware...), then the
    operator's tags over them (a tag wins: `type=survey-quad` can refine what the autopilot says)."""
    out: dict[str, str] = {}
    for src in (meta or {}, tags or {}):
        for k, v in src.items():
            if isinstance(v, bool):  # before int: a bool is an int
                out[str(k)] = "true" if v else "false"
            elif isinstance(v, str | int | float):
                out[str(k)] = str(v)
    return out


def select(views: Mapping[str, Mapping[str, str]], selector: Mapping[str, str]) -> list[str]:
    """The vehicles whose tag view has every selector pair (sorted by id, the rollout's order)."""
    return sorted(vid for vid, tags in views.items() if all(tags.get(k) == v for k, v in selector.items()))


# -- waves ------------------------------------------------------------------------------------


def parse_waves(text: str) -> tuple[float, ...]:
    """`10%,50%,100%` -> (0.1, 0.5, 1.0); the last wave is always the whole set (100% is added if missing)."""
    out: list[float] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        m = re.fullmatch(r"(\d+(?:\.\d+)?)%", part)
        if m is None or not 0 < float(m.group(1)) <= 100:
            raise RolloutError(f"wave {part!r}: expected a percentage of the targets in (0, 100], e.g. 10%,50%,100%")
        frac = float(m.group(1)) / 100
        if out and frac <= out[-1]:
            raise RolloutError(f"waves must grow: {part} after {out[-1] * 100:g}%")
        out.append(frac)
    if not out or out[-1] < 1.0:
        out.append(1.0)
    return tuple(out)


def plan_waves(n: int, *, canary: int, fractions: Sequence[float]) -> tuple[int, ...]:
    """Cumulative wave ends over `n` targets: the canary first, then each fraction of `n` (rounded up).

    A wave that would add no vehicle is dropped, so `--canary 1 --waves 1%` over
    50 vehicles is two waves (1, 50), not three.
    """
    if n <= 0:
        raise RolloutError("no target vehicles")
    if canary < 0:
        raise RolloutError(f"--canary must be 0 or more, not {canary}")
    ends: list[int] = []
    for end in (min(canary, n), *(min(n, math.ceil(f * n - 1e-9)) for f in fractions), n):
        if end > (ends[-1] if ends else 0):
            ends.append(end)
    return tuple(ends)


def parse_threshold(text: str, n: int) -> int:
    """`--max-failures`: a count (`3`) or a share of the targets (`5%`, rounded down) -> the count allowed."""
    t = text.strip()
    try:
        if t.endswith("%"):
            pct = float(t[:-1])
            if not 0 <= pct <= 100:
                raise ValueError(t)
            return math.floor(pct / 100 * n + 1e-9)
        count = int(t)
        if count < 0:
            raise ValueError(t)
        return count
    except ValueError:
        raise RolloutError(f"--max-failures {text!r}: a count (3) or a percentage of the targets (5%)") from None


# -- the document change ---------------------------------------------------------------------


def apply_change(desired: Mapping[str, Any] | None, change: Mapping[str, Any]) -> dict[str, Any]:
    """`desired` with each `path: value` set (None removes it): what `mavjet shadow set` does per vehicle."""
    return set_paths(desired, change)
