"""The event catalogue (contract/events.py) is the one place an event type or a command name is defined.

Three ways it could drift, one test each:

- a rule names a type the catalogue does not know (the spool's classes, the
  event budget's exemptions, analytics' effects and flight split, the
  shadow's wake-ups, the subjects' list, docs/events.md);
- a module emits a type that is not in the catalogue (checked on the source,
  every emit site; the gateway's real output is checked against the
  catalogue's fields by tests/commands/test_events_emitted.py);
- a module spells an event or command name as a string literal where it
  names an event or a command, instead of using `EventType` / `CommandName`
  (the rule is in `test_no_event_or_command_name_literals`' docstring).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from mavjet.contract.commands import CATALOGUE, CommandName
from mavjet.contract.events import (
    BUDGET_EXEMPT,
    EFFECTS,
    EVENTS,
    PUBLISHED,
    SPOOL_CLASS,
    EventType,
    FlightEdge,
    SpoolClass,
    flight_edge,
    spec,
)

ROOT = Path(__file__).resolve().parent.parent
EVENT_NAMES = frozenset(t.value for t in EventType)
COMMAND_NAMES = frozenset(c.value for c in CommandName)
NAMES = EVENT_NAMES | COMMAND_NAMES
# The catalogue itself, and the command catalogue, are where the names are spelled.
CATALOGUES = {ROOT / "contract" / "events.py", ROOT / "contract" / "commands.py"}
# Scanned: every layer that emits, reads or classifies events or sends commands. sim/ is the test
# peer and speaks MAVLink, not events; tests and benchmarks may spell names to check them.
SCANNED = ("contract", "drivers", "gateway", "ops", "analytics")


def _sources() -> list[Path]:
    return [p for d in SCANNED for p in sorted((ROOT / d).rglob("*.py")) if p not in CATALOGUES]


def unknown_events(names: Iterable[str]) -> set[str]:
    """The names in a rule that the catalogue does not know."""
    return {str(n) for n in names} - EVENT_NAMES


# -- 1. the catalogue and the rules that read it ---------------------------------------------


def test_one_entry_per_type_and_consistent_derived_tables() -> None:
    assert set(EVENTS) == set(EventType)
    assert all(s.type is t for t, s in EVENTS.items())
    assert {t for t in EventType if t is not EventType.PARAM_VALUE} == PUBLISHED
    assert SPOOL_CLASS[EventType.CMD_RESULT] is SpoolClass.CMD_RESULT
    assert EventType.FAILSAFE in SPOOL_CLASS and EventType.STATUSTEXT not in SPOOL_CLASS
    exempt = {EventType.CMD_RESULT, EventType.EVENTS_SUPPRESSED, EventType.GATEWAY_STARTED, EventType.GATEWAY_STOPPED,
              EventType.OWNER_ACQUIRED, EventType.OWNER_RELEASED}
    assert exempt == BUDGET_EXEMPT
    assert (flight_edge(FlightEdge.START), flight_edge(FlightEdge.END)) == (EventType.ARMED, EventType.DISARMED)
    assert EFFECTS[CommandName.RTL] == (EventType.LANDED, 1800.0)
    assert set(EFFECTS) <= set(CATALOGUE)  # effects of commands the gateway knows
    assert spec("takeoff").confirms[0].command is CommandName.TAKEOFF
    try:
        spec("landing")
    except KeyError as exc:
        assert "unknown event type 'landing'" in str(exc)
    else:
        raise AssertionError("spec() accepted a type the catalogue does not know")


def test_rules_name_only_catalogued_types() -> None:
    from mavjet.analytics import fleet, jobs
    from mavjet.contract.subjects import EVENT_TYPES
    from mavjet.gateway.publish.spool import EVENT_CLASS
    from mavjet.gateway.shadow.reconciler import _WAKE_EVENTS
    from mavjet.gateway.twin.budget import EXEMPT_TYPES

    assert unknown_events({"armed", "landing"}) == {"landing"}  # the check can fail
    rules: dict[str, Iterable[str]] = {
        "spool classes": EVENT_CLASS,
        "budget exemptions": EXEMPT_TYPES,
        "analytics effects": [t for t, _w in fleet.EFFECTS.values()],
        "analytics command events": fleet.COMMAND_EVENT_TYPES,
        "flight split": (jobs.FLIGHT_START, jobs.FLIGHT_END),
        "shadow wake-ups": _WAKE_EVENTS,
        "subjects' list": EVENT_TYPES,
    }
    for rule, names in rules.items():
        assert not unknown_events(names), f"{rule} names unknown event types {unknown_events(names)}"
    assert set(fleet.EFFECTS) <= COMMAND_NAMES
    assert {t.value for t in PUBLISHED} == EVENT_TYPES


def _documented_types() -> dict[str, set[str]]:
    """docs/events.md's type table: type -> the field names its row lists."""
    text = (ROOT / "docs" / "events.md").read_text()
    table = text.split("Type-specific fields:", 1)[1].split("\n## ", 1)[0]
    out: dict[str, set[str]] = {}
    for line in table.splitlines():
        m = re.match(r"^\| `([a-z_]+)` \| (.*) \|$", line)
        if m:
            out[m.group(1)] = set(re.findall(r"`([a-z_0-9]+)`", m.group(2)))
    return out


def test_docs_list_the_published_types_with_their_fields() -> None:
    documented = _documented_types()
    assert set(documented) == {t.value for t in PUBLISHED}
    for name, fields in documented.items():
        s = spec(name)
        missing = set(s.fields) - fields
        assert not missing, f"docs/events.md does not list {sorted(missing)} for {name}"


# -- 2. every emit site emits a catalogued type ----------------------------------------------

def _func_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _module_constants(tree: ast.Module) -> dict[str, ast.expr]:
    return {t.id: n.value for n in tree.body if isinstance(n, ast.Assign)
            for t in n.targets if isinstance(t, ast.Name)}


def _is_member(node: ast.expr, consts: dict[str, ast.expr]) -> bool:
    if isinstance(node, ast.Name) and node.id in consts:
        node = consts[node.id]
    return (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id == "EventType" and node.attr in EventType.__members__)


def _is_emit(call: ast.Call) -> bool:
    """`x.emit(type, ...)` (a twin, a vehicle handle, a step's context) or `Event(type, ...)`.

    A bare `emit(...)` is not one: in the gateway that name is a log call chosen by level.
    """
    f = call.func
    return (isinstance(f, ast.Attribute) and f.attr == "emit") or (isinstance(f, ast.Name) and f.id == "Event")


def emit_offenders(tree: ast.Module, where: str) -> list[str]:
    """Emit sites whose type is not `EventType.<member>` (or a module constant bound to one).

    A function that forwards its own parameter (`def emit(self, etype, ...)`) is the emitter itself,
    not a site: its callers are checked.
    """
    consts = _module_constants(tree)
    out: list[str] = []

    def visit(node: ast.AST, params: frozenset[str]) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            a = node.args
            params = params | {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}
        if isinstance(node, ast.Call) and _is_emit(node) and node.args:
            first = node.args[0]
            if not (_is_member(first, consts) or (isinstance(first, ast.Name) and first.id in params)):
                out.append(f"{where}:{node.lineno} {ast.unparse(first)}")
        for child in ast.iter_child_nodes(node):
            visit(child, params)

    visit(tree, frozenset())
    return out


def test_emit_offenders_can_fail() -> None:
    bad = ast.parse('def f(v):\n    v.emit("armed")\n    v.emit(EventType.LANDING)\n    v.emit(EventType.LANDED)\n')
    assert emit_offenders(bad, "x.py") == ["x.py:2 'armed'", "x.py:3 EventType.LANDING"]


def _emitters() -> list[Path]:
    """What makes events: the gateway, and analytics' synthetic history (its `emit` mimics the gateway's).

    analytics/progress.py's `emit(line)` prints a progress line: not an event, so not scanned.
    """
    return [*sorted((ROOT / "gateway").rglob("*.py")), ROOT / "analytics" / "synth.py"]


def test_every_emit_site_names_a_catalogued_type() -> None:
    offenders = [o for p in _emitters() for o in emit_offenders(ast.parse(p.read_text()), str(p.relative_to(ROOT)))]
    assert not offenders, "emit an EventType member (contract/events.py): " + ", ".join(offenders)
    emitting = {p.relative_to(ROOT).as_posix() for p in _emitters()
                if any(isinstance(n, ast.Call) and _is_emit(n) for n in ast.walk(ast.parse(p.read_text())))}
    assert {"gateway/twin/telemetry.py", "gateway/twin/vehicle.py", "gateway/commands/executor.py",
            "analytics/synth.py"} <= emitting


# -- 3. no event or command name spelled as a literal ----------------------------------------

# Calls whose arguments name an event type or a command.
NAMING_CALLS = frozenset({
    "emit", "Event", "publish_event", "_t", "command", "call", "event_subject", "event_filter", "cmd_subject",
    "spec_for", "subscribe_events",
})
# Keyword arguments that name an event type or a command, whatever the call.
NAMING_KEYWORDS = frozenset({"etype", "event_type", "effect", "name", "command"})
# What an event's type or a command's name is compared with.
NAMING_OPERANDS = frozenset({"type", "etype", "event_type", "event", "kind", "name", "cmd_name", "command", "step"})


def _names_in(node: ast.expr) -> list[str]:
    """The catalogue names a literal, or a tuple/list/set of literals, spells."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in NAMES:
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [n for e in node.elts for n in _names_in(e)]
    return []


def _terminal(node: ast.expr) -> str:
    """What an operand is called: `ev.type` and `type` are "type", and so is `rec["type"]`."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return node.slice.value
    return ""


def _all_literal_names(elts: list[ast.expr | None]) -> bool:
    return len(elts) >= 2 and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) and e.value in NAMES for e in elts)


def literal_offenders(tree: ast.Module, where: str) -> Iterator[str]:
    for node in ast.walk(tree):
        found: list[str] = []
        if isinstance(node, ast.Call):
            if _func_name(node) in NAMING_CALLS:
                found += [n for a in node.args for n in _names_in(a)]
            found += [n for k in node.keywords if k.arg in NAMING_KEYWORDS for n in _names_in(k.value)]
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_terminal(o) in NAMING_OPERANDS for o in operands):
                found += [n for o in operands for n in _names_in(o)]
        elif isinstance(node, ast.Tuple | ast.List | ast.Set) and _all_literal_names(list(node.elts)):
            found += _names_in(node)
        elif isinstance(node, ast.Dict) and _all_literal_names(list(node.keys)):
            found += [n for k in node.keys if k is not None for n in _names_in(k)]
        for name in found:
            yield f"{where}:{node.lineno} {name!r}"
    for stmt in tree.body:  # a module constant bound to a name
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant):
            yield from (f"{where}:{stmt.lineno} {n!r}" for n in _names_in(stmt.value))


def test_literal_offenders_can_fail() -> None:
    src = '''
STARTED = "log_download_started"
v.emit("armed")
if ev.type == "statustext": pass
await cc.call(vid, "rtl")
raise CommandInvalid("x", name="set_mode")
TYPES = ("armed", "disarmed")
EFFECTS = {"arm": 1, "land": 2}
ok = {"armed": True, "mode": "GUIDED"}["armed"], status.get("armed"), key == "armed", ("params", "armed")
done = out["event"] == "log_downloaded"
'''
    got = sorted(literal_offenders(ast.parse(src), "x.py"), key=lambda o: (int(o.split(":")[1].split()[0]), o))
    assert got == ["x.py:2 'log_download_started'", "x.py:3 'armed'", "x.py:4 'statustext'", "x.py:5 'rtl'",
                   "x.py:6 'set_mode'", "x.py:7 'armed'", "x.py:7 'disarmed'", "x.py:8 'arm'", "x.py:8 'land'",
                   "x.py:10 'log_downloaded'"]


def test_no_event_or_command_name_literals() -> None:
    """No module outside the catalogue spells an event type or a command name as a string literal.

    A literal counts when it NAMES an event or a command: an argument of a
    call that takes one (`emit`, `Event`, `publish_event`, analytics' `_t`,
    a command client's `call`/`command`, `event_subject`, `cmd_subject`...),
    a keyword argument `etype=`, `event_type=`, `effect=`, `name=`,
    `command=`, a comparison with something called `type`, `etype`,
    `event_type`, `event`, `kind`, `name`, `cmd_name`, `command` or `step`
    (an attribute, a variable or a `["type"]` key), a tuple, list or
    set made only of such names (a rule: which types do X), a dict keyed only
    by them (a rule table), or a module constant bound to one. Those must be
    `EventType.X` / `CommandName.X`.

    The same words are legitimate elsewhere and are left alone: state and
    payload keys (`status["armed"]`, `.get("armed")`, `{"armed": ...}` beside
    other keys, Spark columns `F.col("armed")`), the shadow's step names
    (`armed`, `mode`) among others, log event names, protocol labels inside
    a class (`PROTOCOL = "mission_upload"` names a MAVLink transfer), and
    docstrings.
    """
    offenders = [o for p in _sources() for o in literal_offenders(ast.parse(p.read_text()), str(p.relative_to(ROOT)))]
    assert not offenders, "use EventType / CommandName (contract/events.py, commands.py): " + ", ".join(offenders)
