"""One airborne rule (mavjet.drivers.mavlink.autopilot.is_airborne), used by telemetry, commands and the shadow.

The three used to disagree about MAV_LANDED_STATE_LANDING: the command
precondition let a takeoff through while the vehicle was landing. The source
check keeps anyone from growing a private copy again; the behaviour checks
show LANDING is airborne where each rule is applied.
"""

from __future__ import annotations

import ast
from pathlib import Path

from mavjet.drivers.mavlink.dialect import mavlink2 as m
from mavjet.gateway.twin.telemetry import TelemetryModel
from tests.gateway.test_telemetry import ARMED, ext, feed, hb, pos

ROOT = Path(__file__).resolve().parents[2]
RULE_HOME = ROOT / "drivers" / "mavlink" / "autopilot.py"
# States only an "airborne" set needs: nobody but the rule's home may name them.
AIRBORNE_ONLY = {"MAV_LANDED_STATE_TAKEOFF", "MAV_LANDED_STATE_LANDING"}


def _sources() -> list[Path]:
    return [p for pkg in ("gateway", "drivers") for p in sorted((ROOT / pkg).rglob("*.py")) if p != RULE_HOME]


def _imports_is_airborne(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(
        isinstance(node, ast.ImportFrom) and node.module == "mavjet.drivers.mavlink.autopilot"
        and any(a.name == "is_airborne" for a in node.names)
        for node in ast.walk(tree)
    )


def test_no_private_airborne_sets() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.attr}"
        for path in _sources()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr in AIRBORNE_ONLY
    ]
    assert not offenders, "use mavjet.drivers.mavlink.autopilot.is_airborne: " + ", ".join(offenders)


def test_telemetry_commands_and_shadow_use_the_one_rule() -> None:
    assert _imports_is_airborne(ROOT / "gateway" / "telemetry.py")
    users = {p.relative_to(ROOT).parts[:2] for p in _sources() if _imports_is_airborne(p)}
    assert ("gateway", "commands") in users, "the command preconditions must judge airborne with is_airborne"
    assert ("gateway", "shadow") in users, "the shadow must judge airborne with is_airborne"


def test_telemetry_landing_counts_as_airborne() -> None:
    v = TelemetryModel(vid="VID-001")
    feed(v, hb(), ext(m.MAV_LANDED_STATE_ON_GROUND), pos(0.0))
    # Straight from the ground into LANDING (a short hop) is a takeoff, and LANDING -> ON_GROUND a landing.
    assert feed(v, hb(base=ARMED), ext(m.MAV_LANDED_STATE_LANDING), pos(4.0)) == ["armed", "takeoff"]
    assert feed(v, ext(m.MAV_LANDED_STATE_ON_GROUND)) == ["landed"]


def test_disarm_while_landing_lands_first() -> None:
    v = TelemetryModel(vid="VID-001")
    feed(v, hb(), ext(m.MAV_LANDED_STATE_ON_GROUND), pos(0.0))
    feed(v, hb(base=ARMED), ext(m.MAV_LANDED_STATE_IN_AIR), pos(10.0), ext(m.MAV_LANDED_STATE_LANDING), pos(0.5))
    assert feed(v, hb()) == ["landed", "disarmed"]  # ArduPilot disarms at touchdown before ON_GROUND arrives
