"""The import rules of docs/architecture.md, checked on the source (AST).

Every `import` and `from ... import` counts, at module level or inside a
function: a lazy import is still a dependency. A layer may import itself and
the layers listed for it, nothing else of mavjet.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Folder = layer: each top-level folder below is one layer, installed as mavjet.<folder>
# (pyproject.toml's package-dir). Layer -> the layers it may import (itself always allowed).
LAYERS: dict[str, frozenset[str]] = {
    "contract": frozenset(),
    "drivers": frozenset({"contract"}),
    "sim": frozenset({"contract"}),  # the test peer: it must not share code with what it tests
    "analytics": frozenset({"contract"}),
    "gateway": frozenset({"contract", "drivers"}),
    "ops": frozenset({"contract", "drivers", "gateway", "analytics"}),
    "benchmarks": frozenset({"contract", "drivers", "gateway", "ops", "sim", "analytics"}),
}
# The dispatcher finds the commands through entry points: it imports no layer but the contract (the version).
DISPATCHER = ("ops/cli.py", frozenset({"contract"}))


def layer_of(module: str) -> str | None:
    """`mavjet.<folder>.…` -> the folder; None for anything that is not mavjet."""
    parts = module.split(".")
    return parts[1] if parts[0] == "mavjet" and len(parts) > 1 else None


def allowed(path: Path) -> frozenset[str]:
    rel = path.relative_to(ROOT).as_posix()
    layer = rel.split("/", 1)[0]
    if rel == DISPATCHER[0]:
        return DISPATCHER[1] | {"ops"}
    return LAYERS[layer] | {layer}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["mavjet", *parts])


def imports(path: Path) -> list[tuple[int, str]]:
    """Every module `path` imports (absolute, dotted), with its line."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[int, str]] = []
    pkg = module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" else module_name(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            found.append((node.lineno, mod))
            # `from mavjet.gateway import twin` names a subpackage
            found += [(node.lineno, f"{mod}.{alias.name}") for alias in node.names]
    return found


def sources() -> list[Path]:
    return sorted(p for layer in LAYERS for p in (ROOT / layer).rglob("*.py"))


def test_every_layer_is_a_folder_and_every_folder_with_code_a_layer() -> None:
    """No package at the top but a layer (tests/ aside, and deploy/'s scripts); a new folder needs its row above."""
    folders = {p.parent.relative_to(ROOT).parts[0] for p in ROOT.glob("*/**/*.py")
               if not p.relative_to(ROOT).parts[0].startswith(".") and p.relative_to(ROOT).parts[0] not in ("build", "deploy")}
    assert folders - {"tests"} == set(LAYERS)
    assert all((ROOT / layer / "__init__.py").is_file() for layer in LAYERS)


def test_nothing_imports_a_layer_by_its_folder_name() -> None:
    """Everything imports as mavjet.<layer>: `import gateway` would find nothing once installed."""
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {mod}"
             for path in [*sources(), *sorted((ROOT / "tests").rglob("*.py"))]
             for line, mod in imports(path) if mod.split(".", 1)[0] in LAYERS]
    assert not wrong, "\n".join(wrong)


def test_layers_import_only_what_the_rules_allow() -> None:
    broken = []
    for path in sources():
        src = layer_of(module_name(path))
        ok = allowed(path)
        for line, mod in imports(path):
            dst = layer_of(mod)
            if dst is not None and dst not in ok:
                broken.append(f"{path.relative_to(ROOT)}:{line} ({src}) imports {mod} ({dst})")
    assert not broken, "import rules broken (docs/architecture.md):\n" + "\n".join(broken)


def test_no_package_imports_another_in_a_cycle() -> None:
    edges: dict[str, set[str]] = {}
    for path in sources():
        src = layer_of(module_name(path))
        for _, mod in imports(path):
            dst = layer_of(mod)
            if dst is not None and dst != src and src is not None:
                edges.setdefault(src, set()).add(dst)

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in edges.get(start, ()):
            if nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})):
                return True
        return False

    cycles = sorted(a for a in edges if reaches(a, a, {a}))
    assert not cycles, f"layers in an import cycle: {cycles}"


@pytest.mark.parametrize("module", ["mavjet.contract.errors", "mavjet.contract.subjects", "mavjet.drivers.mavlink.framer"])
def test_the_checker_sees_what_it_claims(module: str) -> None:
    # The checker itself can fail: a known module has the layer and imports we expect.
    path = ROOT / (module.removeprefix("mavjet.").replace(".", "/") + ".py")
    assert path.exists() and module_name(path) == module
    assert layer_of(module) in {"contract", "drivers"}
    assert layer_of("mavjet.ops.fleet") == "ops"
    assert layer_of("mavjet.gateway.daemon") == "gateway"
    assert layer_of("nats.aio.client") is None
    assert "analytics" not in allowed(ROOT / "sim" / "cli.py")
    assert allowed(ROOT / "ops" / "cli.py") == {"contract", "ops"}
    assert {"mavjet.drivers.mavlink.dialect", "__future__"} <= {m for _, m in imports(ROOT / "drivers" / "mavlink" / "framer.py")}
