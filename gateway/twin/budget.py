"""A vehicle's event budget: a token bucket per event type, and the summary of what it held back.

TWIN_EVENTS keeps events for 90 days, so a vehicle (or garbage frames that
carry its system id) must not be able to fill it: ~9,400 bogus events in 40 s
were seen. Each vehicle gets one bucket per event type that refills at
`rate_per_s` up to `burst`; an event that finds its bucket empty is not
published but counted, and once per `window_s` per type the count goes out as
ONE `events_suppressed` event. The defaults are far above a real flight's
rates, so only a flood is ever held back.

Exempt (never suppressed): the types the catalogue marks `budget_exempt`
(contract/events.py): `cmd_result` (every command ends in exactly one
result, whatever else the vehicle does), `events_suppressed` itself, and the
gateway's own start and stop.

Pure and synchronous: the caller passes the time in.
"""

from __future__ import annotations

from dataclasses import dataclass

from mavjet.contract.errors import ConfigError
from mavjet.contract.events import BUDGET_EXEMPT

EXEMPT_TYPES: frozenset[str] = BUDGET_EXEMPT


@dataclass(frozen=True, slots=True, kw_only=True)
class EventBudgetConfig:
    """The `[event_budget]` table (docs/config.md)."""

    rate_per_s: float = 20.0  # refill rate per vehicle and event type
    burst: int = 100  # bucket size: this many back-to-back events pass
    window_s: float = 10.0  # one events_suppressed summary per type per window

    def __post_init__(self) -> None:
        if self.rate_per_s <= 0:
            raise ConfigError("event_budget.rate_per_s", "must be > 0")
        if self.burst < 1:
            raise ConfigError("event_budget.burst", "must be >= 1")
        if self.window_s <= 0:
            raise ConfigError("event_budget.window_s", "must be > 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class Suppressed:
    """What one window held back for one event type."""

    event_type: str
    count: int
    window_s: float


class _Bucket:
    __slots__ = ("at_ns", "held", "tokens", "window_start_ns")

    def __init__(self, tokens: float, at_ns: int) -> None:
        self.tokens = tokens
        self.at_ns = at_ns
        self.held = 0  # suppressed in the open window
        self.window_start_ns = 0  # first suppression of the open window (valid while held > 0)


class EventBudget:
    """One vehicle's buckets. `admit()` per event; `due()` on a timer for the summaries."""

    def __init__(self, cfg: EventBudgetConfig) -> None:
        self.cfg = cfg
        self._rate_per_ns = cfg.rate_per_s / 1e9
        self._window_ns = int(cfg.window_s * 1e9)
        self._buckets: dict[str, _Bucket] = {}
        self.holding = False  # some window is open: `due()` has work

    def admit(self, event_type: str, now_ns: int) -> bool:
        """True if the event may be published; False if it is held back (and counted)."""
        if event_type in EXEMPT_TYPES:
            return True
        b = self._buckets.get(event_type)
        if b is None:
            b = self._buckets[event_type] = _Bucket(float(self.cfg.burst), now_ns)
        elif now_ns > b.at_ns:
            b.tokens = min(float(self.cfg.burst), b.tokens + (now_ns - b.at_ns) * self._rate_per_ns)
            b.at_ns = now_ns
        if b.tokens >= 1.0:
            b.tokens -= 1.0
            return True
        if not b.held:
            b.window_start_ns = now_ns
            self.holding = True
        b.held += 1
        return False

    def due(self, now_ns: int, *, flush: bool = False) -> list[Suppressed]:
        """The windows that have ended (all open ones with `flush`), each reported once."""
        if not self.holding:
            return []
        out: list[Suppressed] = []
        still_open = False
        for etype, b in self._buckets.items():
            if not b.held:
                continue
            elapsed = now_ns - b.window_start_ns
            if flush or elapsed >= self._window_ns:
                out.append(Suppressed(event_type=etype, count=b.held, window_s=round(max(elapsed, 0) / 1e9, 1)))
                b.held = 0
            else:
                still_open = True
        self.holding = still_open
        return out
