"""The simulator says byte for byte what it said when the fixture was written (tests/sim/golden.py).

The proof that a restructuring of sim/ left its behaviour alone: three
scripted scenarios (ArduCopter, PX4, ArduCopter flying the built-in sortie)
on a scripted clock, their framed output compared by sha256. A deliberate
change of behaviour rewrites the fixture: `python -m tests.sim.golden --write`.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.sim import golden

EXPECTED: dict[str, dict[str, Any]] = json.loads(golden.FIXTURE.read_text())


def test_the_fixture_covers_every_scenario() -> None:
    assert sorted(EXPECTED) == sorted(golden.SCENARIOS)


@pytest.mark.parametrize("name", sorted(golden.SCENARIOS))
def test_scenario_bytes_unchanged(name: str) -> None:
    got = golden.SCENARIOS[name]()
    # frames and bytes first: a count that moved says more than two digests that differ
    assert (got["frames"], got["bytes"]) == (EXPECTED[name]["frames"], EXPECTED[name]["bytes"])
    assert got["sha256"] == EXPECTED[name]["sha256"]


def test_a_scenario_is_deterministic() -> None:
    """Run twice in one process: nothing in the model (a clock, a set's order, a shared rng) leaks between runs."""
    assert golden.SCENARIOS["px4"]() == golden.SCENARIOS["px4"]()
