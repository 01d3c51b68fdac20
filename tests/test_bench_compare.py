"""`mavjet bench compare`: the summary is pure; the run is checked end to end on a tiny benchmark."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mavjet.benchmarks.cli import BENCHMARKS
from mavjet.benchmarks.compare import (
    _COLOCATED,
    compare,
    derived,
    install_sim,
    isolate_tree,
    sim_digest,
    summarise,
    unequal_work,
    use_tree_sim,
)
from mavjet.ops.compile import HOT_MODULES, LAYERS, SIM_MODULES
from mavjet.sim.cli import compiled_from_ready
from tests.support.compiled import cannot_compile

ROOT = Path(__file__).resolve().parent.parent


def test_summary_means_each_side_and_gives_new_over_ref() -> None:
    ref = [{"msgs": 100, "lat": {"p50": 2.0}, "ok": True, "name": "x"}, {"msgs": 300, "lat": {"p50": 4.0}}]
    new = [{"msgs": 150, "lat": {"p50": 1.0}}, {"msgs": 250, "lat": {"p50": 2.0}, "extra": 1}]
    table = summarise(ref, new)
    assert table["msgs"] == {"ref": 200.0, "new": 200.0, "ratio": 1.0}
    assert table["lat.p50"] == {"ref": 3.0, "new": 1.5, "ratio": 0.5}
    assert "ok" not in table and "name" not in table and "extra" not in table


def test_the_summary_adds_cpu_per_unit_of_work_and_per_vehicle_second() -> None:
    # 65 % of a core for 28,000 MAVLink messages and 24,000 state samples a second from 1,000
    # vehicles: 12.5 µs a unit of work, 0.65 ms a vehicle-second. A side that shed two thirds
    # of its state counts that publishing no more.
    kept = {"vehicles": 1000, "gateway_cpu_pct": 65.0, "mavlink_msgs_per_s": 28000.0, "state_msgs_per_s": 24000.0}
    shed = {**kept, "gateway_cpu_pct": 95.0, "state_msgs_per_s": 8000.0}
    assert derived(kept) == {"gateway_cpu_us_per_unit_of_work": 12.5, "gateway_cpu_ms_per_vehicle_s": 0.65}
    table = summarise([shed], [kept])
    assert table["gateway_cpu_us_per_unit_of_work"] == {"ref": 26.389, "new": 12.5, "ratio": 0.474}
    assert table["gateway_cpu_ms_per_vehicle_s"]["ratio"] == 0.684
    # Reports without the inputs (other benchmarks) get nothing derived.
    assert derived({"msgs": 1}) == {} and derived({"gateway_cpu_pct": 50.0, "vehicles": 0}) == {}
    assert "gateway_cpu_us_per_unit_of_work" not in summarise([{"msgs": 1.0}], [{"msgs": 2.0}])


def test_colocated_benchmarks_are_benchmarks() -> None:
    # A renamed benchmark must not silently lose its server's setting on the ref side.
    assert _COLOCATED.issubset(BENCHMARKS) and "ingest" in _COLOCATED and "replay" not in _COLOCATED


def test_summary_of_a_zero_reference_has_no_ratio() -> None:
    assert summarise([{"dropped": 0}], [{"dropped": 3}])["dropped"]["ratio"] is None


def test_a_side_that_shed_state_is_flagged_as_unequal_work() -> None:
    # 5136316 at 1,000 vehicles stored 8k of 24k state/s on a slow host: its CPU per message
    # counted a third of the publishing work, so the ratio is no like-for-like figure.
    kept = {"sustained": True, "state_msgs_per_s": 24001.0, "state_expected_per_s": 24000.0}
    shed = {"sustained": False, "state_msgs_per_s": 8147.0, "state_expected_per_s": 24000.0}
    assert unequal_work([kept, kept], [kept]) == []
    assert unequal_work([{"msgs": 1}], [{"msgs": 2}]) == []  # benchmarks without the figure
    (note,) = unequal_work([kept, shed, shed], [kept, kept])
    assert note.startswith("the ref side") and "2 of 3 runs" in note and "(8147, 8147 of 24000/s)" in note
    notes = unequal_work([shed], [shed])
    assert [n.split()[1] for n in notes] == ["ref", "new"]


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="needs a git checkout")
@pytest.mark.timeout(300)  # with --new-compiled, a ~35 s build first
def test_compare_runs_both_sides_and_writes_the_table(tmp_path: Path) -> None:
    # HEAD against the working tree, on the smallest ingest run: proves the worktree, the
    # PYTHONPATH switch and the table, not speed. The working tree's side runs compiled
    # (--new-compiled) where this machine can build C extensions.
    out = tmp_path / "cmp.json"
    compiled = cannot_compile() is None
    # The worktree goes under this test's own temporary dir: another test may hold a worktree of
    # its own meanwhile (make test runs two pytests side by side).
    own_tmp = tmp_path / "tmp"
    own_tmp.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "mavjet.ops", "bench", "compare", "HEAD", "--rounds", "1", "--json", str(out),
         "--cpu-hog", "1", "--new-arg=--uvloop", *(["--new-compiled"] if compiled else []),
         "--", "ingest", "--vehicles", "2", "--duration", "1", "--warmup", "0.5", "--baseline-seconds", "0.5"],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False, env={**os.environ, "TMPDIR": str(own_tmp)},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert len(data["ref_runs"]) == 1 and len(data["new_runs"]) == 1
    assert data["summary"]["vehicles"] == {"ref": 2.0, "new": 2.0, "ratio": 1.0}
    assert "new/ref" in proc.stdout
    assert isinstance(data["warnings"], list)  # runs that shed state are named (unequal_work)
    # Both sides drove the working tree's simulator (--ref-sim tree, the default).
    assert data["ref_sim"] == "tree" and data["sim_digest"]["ref"] == data["sim_digest"]["new"] == sim_digest(ROOT)
    # --new-arg reaches the working tree's side only (the edge hub as deployed now against today's).
    assert data["new_args"] == ["--uvloop"] and "side only: --uvloop" in proc.stdout
    assert (data["ref_runs"][0]["event_loop"], data["new_runs"][0]["event_loop"]) == ("asyncio", "uvloop")
    # --new-compiled: the working tree's side from a compiled copy, the ref's interpreted; never the checkout.
    assert data["new_compiled"] is compiled
    assert (data["ref_runs"][0]["hot_modules_compiled"], data["new_runs"][0]["hot_modules_compiled"]) == (
        0, len(HOT_MODULES) if compiled else 0)
    assert not [so for layer in LAYERS for so in (ROOT / layer).rglob("*.so")]  # never the checkout
    # Overload's promises are reported (issue 15, goal 5): every event stored, the connection kept.
    new = data["new_runs"][0]
    assert new["events_enqueued"] > 0 and new["events_lost"] == 0 and new["nats_reconnects"] == 0
    # The fleet epoll's passes are counted, each reading at least one ready socket (uvloop too).
    assert new["reactor_passes_per_s"] > 0 and new["reads_per_reactor_pass"] >= 1.0, new
    # The co-located nats-server runs on COLOCATED_GOMAXPROCS Go threads, unless the environment says.
    assert new["nats_gomaxprocs"] == os.environ.get("GOMAXPROCS", "1"), new
    # The kernel's part of the gateway's CPU is split out (os.times counts in clock ticks: a margin).
    assert 0.0 <= new["gateway_cpu_sys_pct"] <= new["gateway_cpu_pct"] + 1.0, new
    # The waits for a CPU (benchmarks/cpuwait.py) are in the report, where Linux says.
    if Path("/proc/self/schedstat").exists():
        assert all(new[f"{p}_cpu_wait_pct"] is not None and new[f"{p}_cpu_wait_pct"] >= 0
                   for p in ("gateway", "sim", "nats")), new
    assert data["cpu_hog"] == 1 and not _hogs_left(own_tmp), "the load processes outlived the comparison"
    listed = subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert str(own_tmp) not in listed and not list(own_tmp.iterdir())  # the temporary worktree is gone
    # ... and so is its temporary directory with the rounds' reports (the run lines name them).
    reports = [Path(w) for w in proc.stdout.split() if "mavjet-compare-" in w and w.endswith(".json")]
    assert reports and not any(r.parent.exists() for r in reports), reports


def _hogs_left(own_tmp: Path) -> list[str]:
    """Processes still running the load's busy loop (mavjet.benchmarks.kit.cpu_hogs) that this
    comparison started: they inherited its TMPDIR (another test's load may be running meanwhile)."""
    left = []
    marker = f"TMPDIR={own_tmp}".encode()
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        if b"while True: pass" in cmd and b"-c" in cmd and marker in environ.split(b"\0"):
            left.append(proc.name)
    return left


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="needs a git checkout")
@pytest.mark.skipif(cannot_compile() is not None, reason=cannot_compile() or "")
@pytest.mark.timeout(300)  # a ~35-80 s build first
def test_ref_compiled_runs_the_refs_side_from_its_own_compiled_copy(tmp_path: Path) -> None:
    # The ref's side compiled by the ref's own `mavjet compile`, the working tree's left
    # interpreted: each side runs what it was given, and the ref's worktree is not compiled in place.
    # --sim-compiled: both sides' simulator compiled, the ref's from its worktree, the new one's from
    # the front of its PYTHONPATH; each report says so.
    out = tmp_path / "cmp.json"
    proc = subprocess.run(
        [sys.executable, "-m", "mavjet.ops", "bench", "ingest", "--compare", "HEAD", "--ref-compiled", "--sim-compiled",
         "--rounds", "1", "--json", str(out), "--vehicles", "2", "--duration", "1", "--warmup", "0.5",
         "--baseline-seconds", "0.5"],
        cwd=ROOT, capture_output=True, text=True, timeout=280, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert (data["ref_compiled"], data["new_compiled"], data["sim_compiled"]) == (True, False, True)
    ref, new = data["ref_runs"][0], data["new_runs"][0]
    assert ref["hot_modules_compiled"] > 0 and new["hot_modules_compiled"] == 0, (ref, new)
    assert ref["sim_modules_compiled"] == new["sim_modules_compiled"] == len(SIM_MODULES), (ref, new)
    assert "compiled" in proc.stdout.split("round 1/1")[1].splitlines()[1]  # the ref's run line says so
    assert not [so for layer in LAYERS for so in (ROOT / layer).rglob("*.so")] and not list(ROOT.glob("*__mypyc*"))


def _has_commit(ref: str) -> bool:
    return subprocess.run(["git", "cat-file", "-e", f"{ref}^{{commit}}"], cwd=ROOT, capture_output=True,
                          check=False).returncode == 0


@pytest.mark.skipif(not (ROOT / ".git").exists() or not _has_commit("5136316"), reason="needs the git history")
@pytest.mark.timeout(120)
def test_ref_compiled_with_a_ref_older_than_mavjet_compile_says_so(tmp_path: Path) -> None:
    # 5136316 (issue 15's "today's code") predates `mavjet compile`: one line, before any run.
    out = tmp_path / "cmp.json"
    proc = subprocess.run(
        [sys.executable, "-m", "mavjet.ops", "bench", "compare", "5136316", "--ref-compiled", "--rounds", "1",
         "--json", str(out), "--", "ingest", "--vehicles", "2", "--duration", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=100, check=False,
    )
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("mavjet bench compare: --ref-compiled: 5136316 could not compile itself"), line
    assert "round 1/1" not in proc.stdout and not out.exists()


def test_the_ready_line_says_how_many_simulator_modules_run_compiled() -> None:
    assert compiled_from_ready("ready vehicles=1000 compiled=7") == 7
    assert compiled_from_ready("ready vehicles=1000") == 0  # an interpreted simulator names none
    assert compiled_from_ready("ready vehicles=2 compiled=x") == 0


@pytest.mark.parametrize("layout", ["mavjet", "old"])
def test_a_compiled_simulator_goes_into_the_refs_worktree_with_its_runtime(tmp_path: Path, layout: str) -> None:
    """The ref's benchmark starts its simulator from its worktree: the package and the runtime go there,
    where `use_tree_sim` put the source one (its `sim/`, or an old ref's `mavjet/sim` behind the alias)."""
    built, tree = tmp_path / "sim-compiled", tmp_path / "ref"
    (built / "mavjet" / "sim").mkdir(parents=True)
    (built / "mavjet" / "sim" / "model.py").write_text("# source\n")
    (built / "mavjet" / "sim" / "model.cpython-311-x86_64-linux-gnu.so").write_bytes(b"ext")
    (built / "abc__mypyc.cpython-311-x86_64-linux-gnu.so").write_bytes(b"runtime")
    (built / "compile.log").write_text("log")
    if layout == "mavjet":
        (tree / "contract").mkdir(parents=True)
        dest = tree / "sim"
    else:
        (tree / "gateway").mkdir(parents=True)
        dest = tree / "mavjet" / "sim"
    dest.mkdir(parents=True)
    (dest / "stale.py").write_text("# the ref's own, replaced\n")
    install_sim(built, tree)
    assert sorted(p.name for p in dest.iterdir()) == ["model.cpython-311-x86_64-linux-gnu.so", "model.py"]
    assert (tree / "abc__mypyc.cpython-311-x86_64-linux-gnu.so").read_bytes() == b"runtime"
    assert not (tree / "compile.log").exists()


def test_a_compiled_simulator_is_for_both_sides_only(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as caught:
        compare("HEAD", "ingest", [], rounds=1, out=tmp_path / "x.json", ref_sim="own", sim_compiled=True)
    assert "--sim-compiled" in str(caught.value) and "--ref-sim own" in str(caught.value)
    assert not (tmp_path / "x.json").exists()


_PROBE = """\
import importlib.metadata, json
import mavjet.gateway
try:
    import mavjet.gateway.twin.clock  # the working tree has it (importing only the standard library); the tree below does not
    entry = "imported " + mavjet.gateway.twin.clock.__file__
except ModuleNotFoundError:
    entry = "missing"
print(json.dumps({"gateway": mavjet.gateway.__file__, "entry": entry,
                  "commands": sorted(ep.name for ep in importlib.metadata.entry_points(group="mavjet.commands"))}))
"""


def _probe(tree: Path, program: str = _PROBE) -> dict[str, object]:
    proc = subprocess.run([sys.executable, "-c", program], cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
                          capture_output=True, text=True, timeout=60, check=True)
    out: dict[str, object] = json.loads(proc.stdout)
    return out


_EDITABLE = any(getattr(f, "__module__", "").startswith("__editable___mavjet") for f in sys.meta_path)


@pytest.mark.skipif(not _EDITABLE, reason="mavjet is not installed editable here (the case isolate_tree guards against)")
def test_an_isolated_ref_tree_runs_only_its_own_code(tmp_path: Path) -> None:
    """A ref's processes must not pick up the working tree's modules or its entry points.

    5136316's `gateway` command is `gateway.daemon:main`; through the editable
    install's metadata it ran the working tree's `gateway/entry.py` over its
    own packages and exited on an ImportError (`bench mixed --gateway-ref`).
    A ref of the `mavjet.*` layout has no folder named mavjet: its layers are
    linked into one, so it imports its own.
    """
    tree = tmp_path / "ref"
    for layer in ("contract", "gateway"):
        (tree / layer).mkdir(parents=True)
        (tree / layer / "__init__.py").write_text("")
    (tree / "pyproject.toml").write_text(
        '[project]\nname = "mavjet"\nversion = "0.0.1"\n[project.scripts]\nmavjet = "mavjet.ops.cli:main"\n'
        '[project.entry-points."mavjet.commands"]\nprobe = "mavjet.gateway.probe:main"\n')
    before = _probe(tree)
    # Without isolation: the working tree's package, its modules and its commands.
    assert str(before["gateway"]).startswith(str(ROOT)), before
    assert str(before["entry"]).startswith("imported " + str(ROOT)), before
    assert "gateway" in before["commands"] and "probe" not in before["commands"]  # type: ignore[operator]
    isolate_tree(tree)
    after = _probe(tree)
    assert after == {"gateway": str(tree / "mavjet" / "gateway" / "__init__.py"), "entry": "missing",
                     "commands": ["probe"]}
    # A compiled copy of the ref has no pyproject of its own: it takes the ref's.
    copy = tmp_path / "ref-compiled"
    shutil.copytree(tree / "gateway", copy / "mavjet" / "gateway")
    isolate_tree(copy, pyproject=tree / "pyproject.toml")
    assert _probe(copy)["commands"] == ["probe"]


_ALIAS_PROBE = """\
import json, sys
import sim.cli
import mavjet.sim.cli
try:
    import mavjet.gateway
    gateway = mavjet.gateway.__file__
except ModuleNotFoundError:
    gateway = "missing"
print(json.dumps({"same": sim.cli is mavjet.sim.cli, "spec": mavjet.sim.cli.__spec__.name,
                  "file": mavjet.sim.cli.__file__, "gateway": gateway,
                  "contract": sys.modules["mavjet.contract"].__file__}))
"""


@pytest.mark.skipif(not _EDITABLE, reason="mavjet is not installed editable here (the case isolate_tree guards against)")
def test_an_old_layout_ref_drives_the_working_trees_simulator_through_its_sim_alias(tmp_path: Path) -> None:
    """A ref from before `mavjet.*` (5136316) imports `sim`: with --ref-sim tree that is the working
    tree's `mavjet.sim`, one module object under both names, and nothing else of the working tree."""
    tree = tmp_path / "ref"
    for package in ("gateway", "sim"):
        (tree / package).mkdir(parents=True)
        (tree / package / "__init__.py").write_text("")
    (tree / "sim" / "cli.py").write_text("raise SystemExit('the ref s own simulator ran')\n")
    (tree / "pyproject.toml").write_text('[project]\nname = "mavjet"\nversion = "0.0.1"\n')
    isolate_tree(tree)
    assert not (tree / "mavjet").exists()  # an old-layout tree imports its packages as they are
    use_tree_sim(ROOT, tree)
    got = _probe(tree, _ALIAS_PROBE)
    assert got["same"] is True and got["spec"] == "mavjet.sim.cli", got
    assert got["file"] == str(tree / "mavjet" / "sim" / "cli.py")
    assert got["contract"] == str(tree / "mavjet" / "contract" / "__init__.py")
    assert got["gateway"] == "missing"  # the working tree's daemon does not leak into the ref
    assert sim_digest(tree) == sim_digest(ROOT)


def test_isolating_a_tree_without_its_pyproject_says_so(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"mavjet bench compare: .*pyproject\.toml"):
        isolate_tree(tmp_path)
