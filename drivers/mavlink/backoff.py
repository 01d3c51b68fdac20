"""Capped exponential backoff (pure): the one schedule every retry loop uses.

`capped_delay_s` is the schedule itself (deterministic: a retry book can
store "next try at"); `Backoff` walks it for a loop that reconnects, adding
jitter so that many clients do not retry in step.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

_MAX_EXPONENT = 64  # far past any cap; keeps factor ** n finite


def capped_delay_s(attempts: int, *, initial_s: float, max_s: float, factor: float = 2.0) -> float:
    """The wait after `attempts` failed attempts: initial_s, initial_s*factor, ... capped at max_s (0 → no wait)."""
    if attempts <= 0:
        return 0.0
    return float(min(max_s, initial_s * factor ** min(attempts - 1, _MAX_EXPONENT)))


@dataclass(slots=True, kw_only=True)
class Backoff:
    initial_s: float
    max_s: float
    factor: float = 2.0
    jitter: float = 0.5  # each delay is drawn from [d*(1-jitter), d]
    rng: random.Random = field(default_factory=random.Random)
    _attempts: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.initial_s <= self.max_s:
            raise ValueError("backoff needs 0 < initial_s <= max_s")

    def next_delay_s(self) -> float:
        self._attempts += 1
        d = capped_delay_s(self._attempts, initial_s=self.initial_s, max_s=self.max_s, factor=self.factor)
        return d * (1.0 - self.jitter * self.rng.random())

    def reset(self) -> None:
        self._attempts = 0
