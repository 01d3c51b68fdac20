"""Capped, jittered exponential backoff (pure)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass(slots=True, kw_only=True)
class Backoff:
    initial_s: float
    max_s: float
    factor: float = 2.0
    jitter: float = 0.5  # each delay is drawn from [d*(1-jitter), d]
    rng: random.Random = field(default_factory=random.Random)
    _next_s: float = 0.0

    def __post_init__(self) -> None:
        if not 0 < self.initial_s <= self.max_s:
            raise ValueError("backoff needs 0 < initial_s <= max_s")
        self._next_s = self.initial_s

    def next_delay_s(self) -> float:
        d = self._next_s
        self._next_s = min(self.max_s, self._next_s * self.factor)
        return d * (1.0 - self.jitter * self.rng.random())

    def reset(self) -> None:
        self._next_s = self.initial_s
