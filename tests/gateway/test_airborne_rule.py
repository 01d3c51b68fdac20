"""One decoder per vehicle fact, used by telemetry, the drivers, commands, the shadow, ops and analytics.

The facts a HEARTBEAT or EXTENDED_SYS_STATE carries (armed, airborne, in a
failsafe, past boot) are decoded by `mavjet.contract.vehicle`, the flight
mode per flavour by `mavjet.contract.modes`; the drivers re-export both
(`mavjet.drivers.mavlink.autopilot`, `.modes`). They used to be decoded in
several places and disagreed: about MAV_LANDED_STATE_LANDING the command
precondition let a takeoff through while the vehicle was landing, and the
synthetic history gave PX4 modes ArduPilot's numbers. The source checks keep
anyone from growing a private copy again; the behaviour checks show each
rule applied where it is used.
"""

from __future__ import annotations

import ast
import datetime as dt
from collections.abc import Iterator
from pathlib import Path

from mavjet.contract import modes as contract_modes
from mavjet.contract import vehicle as facts
from mavjet.drivers.mavlink.dialect import mavlink2 as m
from mavjet.gateway.twin.telemetry import TelemetryModel
from tests.gateway.test_telemetry import ARMED, ext, feed, hb, pos

ROOT = Path(__file__).resolve().parents[2]
FACTS_HOME = ROOT / "contract" / "vehicle.py"
MODES_HOME = ROOT / "contract" / "modes.py"
# sim/ is the test peer and decodes nothing of mavjet's on purpose (it must not share code with what it tests).
USERS = ("gateway", "drivers", "ops", "analytics", "contract")
# MAVLink names only a fact's decoder needs: nobody but contract/vehicle.py may name them.
FACT_ONLY = {
    "MAV_LANDED_STATE_TAKEOFF": "is_airborne",
    "MAV_LANDED_STATE_LANDING": "is_airborne",
    "MAV_MODE_FLAG_SAFETY_ARMED": "is_armed",
    "MAV_STATE_CRITICAL": "is_failsafe_state",
    "MAV_STATE_EMERGENCY": "is_failsafe_state",
    "MAV_STATE_STANDBY": "is_past_boot",
}


def _sources(home: Path) -> list[Path]:
    return [p for pkg in USERS for p in sorted((ROOT / pkg).rglob("*.py")) if p != home]


def _named(node: ast.AST) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def fact_offenders(tree: ast.AST, where: str) -> Iterator[str]:
    """Private decoders: a fact-only MAVLink name, the armed bit as a number.

    A constant imported from contract/vehicle.py itself is the one table's (analytics' synthetic
    history writes MAV_STATE_CRITICAL into a failsafe's payload); pymavlink's, or a copy, is not.
    """
    shared = {a.asname or a.name for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.module == "mavjet.contract.vehicle" for a in node.names}
    for node in ast.walk(tree):
        name = _named(node)
        if isinstance(node, ast.Name) and name in shared:
            continue
        if name in FACT_ONLY and not isinstance(getattr(node, "ctx", None), ast.Store):
            yield f"{where}:{node.lineno} {name} (use {FACT_ONLY[name]})"
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitAnd):
            sides = (node.left, node.right)
            if any("base_mode" in _named(s) for s in sides) and any(
                    isinstance(s, ast.Constant) and s.value == facts.MAV_MODE_FLAG_SAFETY_ARMED for s in sides):
                yield f"{where}:{node.lineno} base_mode & 128 (use is_armed)"


def mode_bit_offenders(tree: ast.AST, where: str) -> Iterator[str]:
    for node in ast.walk(tree):
        if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.RShift | ast.LShift)
                and isinstance(node.right, ast.Constant) and node.right.value in (16, 24)
                and "custom" in ast.unparse(node.left)):
            yield f"{where}:{node.lineno} {ast.unparse(node)} (use modes.px4_unpack / px4_pack)"


def test_offender_checks_can_fail() -> None:
    src = ("a = m.MAV_LANDED_STATE_LANDING\nb = bool(msg.base_mode & 128)\nc = MAV_STATE_STANDBY <= s\n"
           "d = (custom_mode >> 16) & 0xFF\n")
    assert [o.split(" ")[0] for o in fact_offenders(ast.parse(src), "x.py")] == ["x.py:1", "x.py:2", "x.py:3"]
    shared = "from mavjet.contract.vehicle import MAV_STATE_CRITICAL\ndata = {'system_status': MAV_STATE_CRITICAL}\n"
    assert not list(fact_offenders(ast.parse(shared), "x.py"))
    assert [o.split(" ")[0] for o in mode_bit_offenders(ast.parse(src), "x.py")] == ["x.py:4"]


def test_no_private_fact_decoders() -> None:
    offenders = [o for p in _sources(FACTS_HOME) for o in fact_offenders(ast.parse(p.read_text()), str(p.relative_to(ROOT)))]
    assert not offenders, "decode vehicle facts with mavjet.contract.vehicle: " + ", ".join(offenders)


def test_no_private_px4_mode_packing() -> None:
    offenders = [o for p in _sources(MODES_HOME)
                 for o in mode_bit_offenders(ast.parse(p.read_text()), str(p.relative_to(ROOT)))]
    assert not offenders, ", ".join(offenders)


def _imports(path: Path, names: set[str]) -> set[str]:
    """Which of `names` the module imports from the decoders' homes (or the drivers' re-exports)."""
    homes = {"mavjet.contract.vehicle", "mavjet.contract.modes", "mavjet.drivers.mavlink.autopilot",
             "mavjet.drivers.mavlink.modes"}
    return {a.name for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) and node.module in homes for a in node.names} & names


def test_every_layer_uses_the_one_decoder() -> None:
    assert _imports(ROOT / "gateway" / "twin" / "telemetry.py", {"is_airborne", "is_armed", "is_failsafe_state"}) \
        == {"is_airborne", "is_armed", "is_failsafe_state"}
    assert _imports(ROOT / "drivers" / "mavlink" / "runner.py", {"heartbeat_armed"})  # the arm/disarm machine
    assert _imports(ROOT / "ops" / "sortie.py", {"is_past_boot"})
    assert _imports(ROOT / "analytics" / "synth.py", {"ModeTable"})
    users = {p.relative_to(ROOT).parts[:2] for p in _sources(FACTS_HOME) if _imports(p, {"is_airborne"})}
    assert ("gateway", "commands") in users, "the command preconditions must judge airborne with is_airborne"
    assert ("gateway", "shadow") in users, "the shadow must judge airborne with is_airborne"


def test_contract_numbers_are_the_dialects() -> None:
    """The contract writes MAVLink enum values as numbers (it has no pymavlink): they must be the dialect's."""
    for name in ("MAV_MODE_FLAG_SAFETY_ARMED", "MAV_LANDED_STATE_UNDEFINED", "MAV_LANDED_STATE_ON_GROUND",
                 "MAV_LANDED_STATE_IN_AIR", "MAV_LANDED_STATE_TAKEOFF", "MAV_LANDED_STATE_LANDING",
                 "MAV_STATE_STANDBY", "MAV_STATE_CRITICAL", "MAV_STATE_EMERGENCY"):
        assert getattr(facts, name) == getattr(m, name), name
    assert contract_modes.MAV_AUTOPILOT_ARDUPILOTMEGA == m.MAV_AUTOPILOT_ARDUPILOTMEGA
    assert contract_modes.MAV_AUTOPILOT_PX4 == m.MAV_AUTOPILOT_PX4
    assert {m.MAV_TYPE_FIXED_WING, m.MAV_TYPE_VTOL_DUOROTOR, m.MAV_TYPE_VTOL_QUADROTOR,
                                          m.MAV_TYPE_VTOL_TILTROTOR, m.MAV_TYPE_VTOL_GYRODYNE} == contract_modes.PLANE_TYPES
    assert {m.MAV_TYPE_GROUND_ROVER, m.MAV_TYPE_SURFACE_BOAT} == contract_modes.ROVER_TYPES


def test_the_decoders() -> None:
    assert facts.is_armed(m.MAV_MODE_FLAG_SAFETY_ARMED | m.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED)
    assert not facts.is_armed(m.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED)
    assert [facts.is_airborne(s) for s in (None, 0, 1, 2, 3, 4)] == [False, False, False, True, True, True]
    assert [facts.is_failsafe_state(s) for s in (None, 4, 5, 6, 7)] == [False, False, True, True, False]
    assert [facts.is_past_boot(s) for s in (None, 1, 2, 3, 4)] == [False, False, False, True, True]
    assert contract_modes.px4_unpack(contract_modes.px4_pack(4, 3)) == (4, 3)


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


def test_synthetic_modes_decode_as_the_gateway_decodes_them() -> None:
    """Every mode change in the synthetic history names the mode its custom_mode decodes to, per flavour."""
    from mavjet.analytics.synth import AuditConfig, generate
    from mavjet.analytics.truth import Truth

    end_ns = int(dt.datetime(2026, 1, 1, tzinfo=dt.UTC).timestamp() * 1e9)
    cfg = AuditConfig(vehicles=8, days=2, end_ns=end_ns, failsafe_prob=0.5)
    flavours: set[str] = set()
    changes = 0
    for batch in generate(cfg, Truth()):
        for ev in batch:
            if ev.type != "mode_changed":
                continue
            table = contract_modes.ModeTable(flavour=contract_modes.Flavour(ev.data["flavour"]),
                                             vehicle_class=contract_modes.VehicleClass.COPTER)
            assert table.name(ev.data["custom_mode"]) == ev.data["mode"], ev
            flavours.add(ev.data["flavour"])
            changes += 1
    assert changes and flavours == {"ardupilot", "px4"}
