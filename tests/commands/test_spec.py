"""Each command is defined once (wire spec + precondition + action), and the enums keep their wire strings."""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass
from pathlib import Path

import msgpack

import mavjet.gateway.commands.executor as executor_module
from mavjet.contract.commands import (
    CATALOGUE,
    RESULTS,
    CmdResult,
    CommandName,
    CommandSpec,
    result_data,
)
from mavjet.gateway.commands.actions import MavCommand
from mavjet.gateway.commands.executor import Disposition
from mavjet.gateway.commands.spec import _DEFS, COMMANDS, CommandDef, command_def


def test_every_catalogue_command_has_exactly_one_definition() -> None:
    names = [d.name for d in _DEFS]
    assert len(names) == len(set(names)), "a command is defined twice"
    assert set(names) == set(CATALOGUE) == {n.value for n in CommandName}
    assert set(COMMANDS) == set(CATALOGUE)
    for name, wire in CATALOGUE.items():
        defn = COMMANDS[name]
        assert isinstance(defn, CommandDef)
        assert defn.wire is wire, name  # the params come from the contract, not a copy
        assert isinstance(defn.wire, CommandSpec) and defn.wire.name == name
        assert callable(defn.precondition) and callable(defn.action) and callable(defn.check), name
        assert command_def(name) is defn


def test_mav_commands_build_an_action_for_valid_params() -> None:
    from mavjet.contract.commands import Command, validate_params

    example = {"takeoff": {"alt_m": 10}, "set_mode": {"mode": "GUIDED"},
               "goto": {"lat_deg": 1.0, "lon_deg": 2.0, "alt_m": 10}}
    from mavjet.drivers.mavlink.modes import Flavour, ModeTable, VehicleClass

    modes = ModeTable(flavour=Flavour.ARDUPILOT, vehicle_class=VehicleClass.COPTER)
    for name, defn in COMMANDS.items():
        if isinstance(defn.action, MavCommand):
            cmd = Command(cmd_id="c", name=name, issued_ns=0, deadline_ns=None,
                          params=validate_params(name, example.get(name, {})))
            assert defn.action.build(cmd, modes).command > 0, name


def _string_compares(node: ast.AST) -> list[str]:
    return [
        c.value
        for n in ast.walk(node) if isinstance(n, ast.Compare)
        for c in (n.left, *n.comparators)
        if isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value in CATALOGUE
    ]


def test_the_executor_has_no_per_command_branches() -> None:
    """The four-places problem: no `if cmd.name == "..."` outside the spec table."""
    tree = ast.parse(Path(inspect.getfile(executor_module)).read_text(encoding="utf-8"))
    assert _string_compares(tree) == []


def test_cmd_result_wire_values() -> None:
    assert {r.name: r.value for r in CmdResult} == {
        "ACCEPTED": "accepted", "REJECTED": "rejected", "FAILED": "failed", "EXPIRED": "expired",
        "INVALID": "invalid", "TIMEOUT": "timeout", "UNKNOWN": "unknown",
    }
    assert RESULTS == ("accepted", "rejected", "failed", "expired", "invalid", "timeout", "unknown")
    assert CmdResult("accepted") is CmdResult.ACCEPTED
    assert f"{CmdResult.TIMEOUT}" == "timeout" and str(CmdResult.INVALID) == "invalid"
    data = result_data(cmd_id="c", name="arm", result=CmdResult.ACCEPTED)
    assert type(data["result"]) is str and data["result"] == "accepted"
    assert msgpack.unpackb(msgpack.packb(data))["result"] == "accepted"


def test_disposition_wire_values() -> None:
    assert {d.name: d.value for d in Disposition} == {
        "ACK": "ack", "NAK": "nak", "TERM": "term", "DUPLICATE": "duplicate", "HANDED_BACK": "handed_back",
    }
    # counted in dicts keyed by the plain strings the tests and metrics use
    assert {Disposition.TERM: 6} == {"term": 6}


def test_command_names_are_the_catalogue_keys() -> None:
    assert [n.value for n in CommandName] == list(CATALOGUE)


def test_takeoff_uses_the_one_airborne_rule() -> None:
    """LANDING is airborne (mavjet.drivers.mavlink.autopilot): a takeoff while landing is refused like one in the air."""
    from mavjet.contract.commands import Command
    from mavjet.drivers.mavlink.autopilot import AIRBORNE_LANDED_STATES
    from mavjet.drivers.mavlink.dialect import mavlink2
    from mavjet.gateway.commands.preconditions import takeoff_failure

    @dataclass
    class Live:
        landed_state: int | None
        armed: bool | None = True
        mode: str | None = "GUIDED"
        failsafe_active: bool = False
        flavour: str = "ardupilot"
        vehicle_class: str = "copter"
        modes: None = None

    takeoff = Command(cmd_id="c", name="takeoff", issued_ns=0, deadline_ns=None, params={"alt_m": 10.0})
    assert mavlink2.MAV_LANDED_STATE_LANDING in AIRBORNE_LANDED_STATES
    for state in AIRBORNE_LANDED_STATES:
        assert takeoff_failure(takeoff, Live(landed_state=state)) == "takeoff refused: the vehicle is already in the air"
    assert takeoff_failure(takeoff, Live(landed_state=mavlink2.MAV_LANDED_STATE_ON_GROUND)) is None
