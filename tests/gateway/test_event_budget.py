"""The per-vehicle event budget: token buckets per type, one summary per window, exempt types."""

from __future__ import annotations

import pytest

from mavjet.contract.errors import ConfigError
from mavjet.gateway.twin.budget import EXEMPT_TYPES, EventBudget, EventBudgetConfig

S = 1_000_000_000


def test_burst_then_rate_then_one_summary_per_window() -> None:
    b = EventBudget(EventBudgetConfig(rate_per_s=10.0, burst=5, window_s=2.0))
    t = 100 * S
    assert [b.admit("statustext", t) for _ in range(8)] == [True] * 5 + [False] * 3
    assert b.holding and b.due(t + S) == []  # window still open
    # Refill: 10/s, so 0.5 s later five more pass.
    assert sum(b.admit("statustext", t + S // 2) for _ in range(7)) == 5
    [s] = b.due(t + 2 * S)
    assert (s.event_type, s.count, s.window_s) == ("statustext", 5, 2.0)
    assert not b.holding and b.due(t + 10 * S) == []  # reported once


def test_types_have_their_own_buckets() -> None:
    b = EventBudget(EventBudgetConfig(rate_per_s=1.0, burst=2, window_s=1.0))
    assert [b.admit("statustext", 0) for _ in range(3)] == [True, True, False]
    assert b.admit("armed", 0) and b.admit("failsafe", 0)


def test_exempt_types_are_never_held_back() -> None:
    assert "cmd_result" in EXEMPT_TYPES and "events_suppressed" in EXEMPT_TYPES
    b = EventBudget(EventBudgetConfig(rate_per_s=1.0, burst=1, window_s=1.0))
    assert all(b.admit("cmd_result", 0) for _ in range(10_000))
    assert not b.holding


def test_flush_reports_open_windows() -> None:
    b = EventBudget(EventBudgetConfig(rate_per_s=1.0, burst=1, window_s=60.0))
    b.admit("statustext", 0)
    b.admit("statustext", 0)
    assert b.due(S) == []
    [s] = b.due(3 * S, flush=True)
    assert s.count == 1 and s.window_s == 3.0


def test_defaults_far_above_a_flight_and_validation() -> None:
    cfg = EventBudgetConfig()
    assert cfg.rate_per_s >= 20 and cfg.burst >= 100
    for bad in ({"rate_per_s": 0.0}, {"burst": 0}, {"window_s": -1.0}):
        with pytest.raises(ConfigError):
            EventBudgetConfig(**bad)  # type: ignore[arg-type]


def test_event_budget_table_in_the_config_file() -> None:
    from mavjet.gateway.resolve import build_config

    cfg = build_config({"event_budget": {"rate_per_s": 5, "burst": 10, "window_s": 30},
                        "vehicles": [{"vid": "VID-001", "endpoint": "tcp:127.0.0.1:5760"}]})
    assert cfg.event_budget == EventBudgetConfig(rate_per_s=5.0, burst=10, window_s=30.0)
    with pytest.raises(ConfigError, match=r"event_budget\.burst"):
        build_config({"event_budget": {"burst": 0}, "vehicles": [{"vid": "VID-001", "endpoint": "tcp:127.0.0.1:5760"}]})
    with pytest.raises(ConfigError, match=r"event_budget\.rate"):
        build_config({"event_budget": {"rate": 1}, "vehicles": [{"vid": "VID-001", "endpoint": "tcp:127.0.0.1:5760"}]})
