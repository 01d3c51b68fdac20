"""The shape of sim/ (its `__init__` docstring): no import cycle between its modules, no private access across them.

Read from the source (AST), not from `sys.modules`: every import counts, at
module level, inside a function or under `if TYPE_CHECKING:` (a cycle that
only the type checker sees is still two modules that cannot be read, or
changed, one without the other). `from mavjet.sim import flight` names the
module `flight`; `from mavjet.sim.state import text` names `state`.
"""

from __future__ import annotations

import ast
from pathlib import Path

SIM = Path(__file__).resolve().parent.parent.parent / "sim"
PACKAGE = "mavjet.sim"


def modules() -> dict[str, Path]:
    return {p.stem: p for p in sorted(SIM.glob("*.py")) if p.stem != "__init__"}


def sim_imports(path: Path, names: set[str]) -> set[str]:
    """The sim modules `path` imports (by short name)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[:2] == ["mavjet", "sim"] and len(parts) > 2:
                    found.add(parts[2])
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:  # relative: sim's modules are siblings
                mod = ".".join([PACKAGE, mod]) if mod else PACKAGE
            parts = mod.split(".")
            if parts[:2] != ["mavjet", "sim"]:
                continue
            if len(parts) > 2:
                found.add(parts[2])
            else:  # from mavjet.sim import flight, telemetry
                found |= {a.name for a in node.names if a.name in names}
    return found - {path.stem}


def graph() -> dict[str, set[str]]:
    mods = modules()
    names = set(mods)
    return {name: sim_imports(path, names) & names for name, path in mods.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `edges` as [a, b, ..., a], or None (depth-first search, white/grey/black)."""
    state: dict[str, int] = dict.fromkeys(edges, 0)
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt, 0) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if state.get(nxt, 0) == 0 and (cycle := visit(nxt)) is not None:
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if state[node] == 0 and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle_and_only_one() -> None:
    """The check below can fail: a cycle of three is found, a diamond is not a cycle."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}) is None


def test_the_reader_sees_every_form_of_import(tmp_path: Path) -> None:
    src = tmp_path / "probe.py"
    src.write_text(
        "from typing import TYPE_CHECKING\n"
        "from mavjet.sim import flight, geo\n"
        "import mavjet.sim.telemetry\n"
        "from mavjet.sim.state import text\n"
        "from . import control\n"
        "if TYPE_CHECKING:\n    from mavjet.sim.model import VehicleModel\n"
        "def f() -> None:\n    from mavjet.sim.stores import on_param_set\n"
    )
    names = {"flight", "geo", "telemetry", "state", "control", "model", "stores"}
    assert sim_imports(src, names) == names


def test_no_import_cycle_between_sim_modules() -> None:
    edges = graph()
    assert {"model", "state", "telemetry", "flight", "control", "commands"} <= set(edges)
    assert find_cycle(edges) is None, f"import cycle in sim/: {' -> '.join(find_cycle(edges) or [])}"


def test_the_state_imports_no_step_module() -> None:
    """The layering the package docstring describes: state under the steps, the model over them."""
    edges = graph()
    steps = {"telemetry", "flight", "control", "failsafe", "lifecycle", "stores", "commands", "health"}
    assert not edges["state"] & (steps | {"model"}), edges["state"]
    for step in steps:
        assert "model" not in edges[step], f"{step} imports the model: steps take the state"
    # and the model dispatches to the steps (the one module that imports the entry points of them all)
    assert {"commands", "control", "lifecycle", "stores", "telemetry"} <= edges["model"]
