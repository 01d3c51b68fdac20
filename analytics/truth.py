"""Ground truth of a synthetic history (mavjet.analytics.synth): what was generated, for tests to check jobs against."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True, kw_only=True)
class FlightTruth:
    vid: str
    start_ns: int
    end_ns: int
    max_alt_m: float
    distance_m: float
    battery_used_pct: float
    modes: list[str]
    failsafes: list[str]
    takeoff_ns: int = 0
    landed_ns: int = 0
    # (name, result) of every command of the flight, in order (the arm that started it included)
    commands: list[tuple[str, str]] = field(default_factory=list)


@dataclass(slots=True, kw_only=True)
class FailsafeTruth:
    vid: str
    time_ns: int
    failsafe_type: str
    landed_ns: int


@dataclass(slots=True, kw_only=True)
class CommandTruth:
    vid: str
    name: str
    result: str
    latency_ms: float
    cmd_id: str = ""
    issued_ns: int = 0  # the cmd_result's time minus its latency


@dataclass(slots=True, kw_only=True)
class ChainTruth:
    """A command and the event it caused (`effect_ns` 0 when it caused none)."""

    vid: str
    cmd_id: str
    name: str
    result: str
    issued_ns: int
    effect_type: str | None
    effect_ns: int = 0


@dataclass(slots=True, kw_only=True)
class Truth:
    """What was generated. Details are kept only when asked (they grow with the history)."""

    keep_detail: bool = True
    events: int = 0
    by_type: Counter[str] = field(default_factory=Counter)
    flights_by_vid: Counter[str] = field(default_factory=Counter)
    failsafes_by_type: Counter[str] = field(default_factory=Counter)
    commands_by_result: Counter[str] = field(default_factory=Counter)
    flights: list[FlightTruth] = field(default_factory=list)
    failsafes: list[FailsafeTruth] = field(default_factory=list)
    commands: list[CommandTruth] = field(default_factory=list)
    chains: list[ChainTruth] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "events": self.events,
            "flights": sum(self.flights_by_vid.values()),
            "vehicles_with_flights": len(self.flights_by_vid),
            "by_type": dict(sorted(self.by_type.items())),
            "failsafes_by_type": dict(sorted(self.failsafes_by_type.items())),
            "commands_by_result": dict(sorted(self.commands_by_result.items())),
        }
