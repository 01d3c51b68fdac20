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
PACKAGES = ("gateway", "drivers", "sim", "analytics", "benchmarks")

# layer -> layers it may import (itself always allowed). Order: most specific prefix first.
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("gateway.contract", frozenset()),
    ("gateway.ops", frozenset({"gateway.contract", "drivers", "gateway.daemon", "analytics", "gateway.root"})),
    ("gateway.cli", frozenset({"gateway.root"})),
    ("gateway.root", frozenset()),
    ("gateway", frozenset({"gateway.contract", "drivers", "gateway.root"})),
    ("drivers", frozenset({"gateway.contract", "gateway.root"})),
    ("sim", frozenset({"gateway.contract", "gateway.root"})),
    ("analytics", frozenset({"gateway.contract", "gateway.root"})),
    ("benchmarks", frozenset({"gateway.contract", "gateway.ops", "gateway.daemon", "drivers", "sim", "analytics", "gateway.root"})),
)


def layer_of(module: str) -> str:
    if module == "gateway":
        return "gateway.root"  # the package's light __init__ (version only)
    if module == "gateway.__main__":
        return "gateway.cli"
    for name in ("gateway.contract", "gateway.ops", "gateway.cli"):
        if module == name or module.startswith(name + "."):
            return name
    top = module.split(".", 1)[0]
    return "gateway.daemon" if top == "gateway" else top


def allowed(src_layer: str) -> frozenset[str]:
    key = "gateway" if src_layer == "gateway.daemon" else src_layer
    for name, deps in LAYERS:
        if name == key:
            return deps | {src_layer}
    raise AssertionError(f"no rule for layer {src_layer}")


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> list[tuple[int, str]]:
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
            # `from gateway import contract` names a submodule
            found += [(node.lineno, f"{mod}.{alias.name}") for alias in node.names if (ROOT / mod.replace(".", "/") / alias.name).exists() or (ROOT / mod.replace(".", "/") / f"{alias.name}.py").exists()]
    return [(line, m) for line, m in found if m.split(".", 1)[0] in PACKAGES]


def sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def test_layers_import_only_what_the_rules_allow() -> None:
    broken = []
    for path in sources():
        src = layer_of(module_name(path))
        ok = allowed(src)
        for line, mod in imports(path):
            dst = layer_of(mod)
            if dst not in ok:
                broken.append(f"{path.relative_to(ROOT)}:{line} ({src}) imports {mod} ({dst})")
    assert not broken, "import rules broken (docs/architecture.md):\n" + "\n".join(broken)


def test_no_package_imports_another_in_a_cycle() -> None:
    edges: dict[str, set[str]] = {}
    for path in sources():
        src = layer_of(module_name(path))
        for _, mod in imports(path):
            dst = layer_of(mod)
            if dst != src:
                edges.setdefault(src, set()).add(dst)

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in edges.get(start, ()):
            if nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})):
                return True
        return False

    cycles = sorted(a for a in edges if reaches(a, a, {a}))
    assert not cycles, f"layers in an import cycle: {cycles}"


@pytest.mark.parametrize("module", ["gateway.contract.errors", "gateway.contract.subjects", "drivers.mavlink.framer"])
def test_the_checker_sees_what_it_claims(module: str) -> None:
    # The checker itself can fail: a known module has the layer and imports we expect.
    path = ROOT / (module.replace(".", "/") + ".py")
    assert path.exists()
    assert layer_of(module) in {"gateway.contract", "drivers"}
    assert layer_of("gateway.ops.fleet") == "gateway.ops"
    assert layer_of("gateway.daemon") == "gateway.daemon"
    assert "analytics" not in allowed("sim")
