"""`mavjet bench compare REF -- NAME [options]`: a benchmark, old code against new, in one run.

These machines' speed varies up to 3x between hours, so figures from different
runs cannot be compared. This runs benchmark NAME from a git ref (checked out
in a temporary worktree, run with its own code on `PYTHONPATH`) and from the
working tree alternately, `--rounds` times each, then prints both means and
their ratio for every numeric figure the two JSON reports share, and writes
them to `benchmarks/results/compare-NAME-STAMP.json` (`kit.default_json`). `mavjet bench ingest --compare REF ...`
is the same thing for the ingest benchmark.

Both sides drive the same simulated vehicles: the working tree's `sim/` is
copied into the ref's worktree (`--ref-sim tree`, the default), so a gateway
is compared with a gateway on the same MAVLink traffic. `--ref-sim own` runs
the ref's own simulator. The JSON records a digest of each side's `sim/`
sources.

A ref's worktree runs as an installed mavjet would (`prepare_tree`): a ref
whose layers are folders imported as `mavjet.<folder>` gets a `mavjet/` of
links to them; a ref from before that layout (five top-level packages,
`gateway`, `sim`, ...) runs as it always did, and with `--ref-sim tree` its
`sim` package becomes an alias of the working tree's `mavjet.sim`, which goes
into the worktree with the working tree's contract (the only layer the
simulator imports).

`--new-arg` adds an option to the working tree's side only, for a comparison
of deployments rather than of code on equal terms: `--new-arg=--uvloop` runs
today's gateway as the edge hub ran it (asyncio) against the new one as the
edge hub runs it now (uvloop). `--new-compiled` runs the working tree's
side from a copy whose hot path `mavjet compile` built with mypyc
(ops/compile.py), as a deployment that compiles it runs; the ref's
side stays as it was, interpreted, unless `--ref-compiled` compiles it too,
with the ref's own `mavjet compile` (a ref from before that command cannot):
compiled against compiled, for a change to the compiled code itself. The
working tree itself is never compiled in place.

`--sim-compiled` runs the simulator of both sides with its tick path
compiled (`mavjet compile --sim`): it shares the two cores with the gateway
and nats-server, and compiled it leaves the gateways more of them, the
same on both sides. The working tree's `sim/` is built once into a
directory of its own, which goes first on both sides' `PYTHONPATH`; the
ref's worktree also gets that package and its mypyc runtime, for a ref
whose benchmark starts its simulator from its working directory. Each
side's JSON from a build with `sim_modules_compiled` confirms it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from statistics import mean
from typing import Any

from mavjet.benchmarks.kit import cpu_hogs, default_json, non_negative_int, positive_int, run_json
from mavjet.ops.compile import LAYERS, SIM_MODULES, build, compile_copy
from mavjet.ops.natsserver import COLOCATED_GOMAXPROCS


def is_mavjet_layout(tree: Path) -> bool:
    """A tree whose layers are folders imported as `mavjet.<folder>` (not five top-level packages)."""
    return (tree / "contract").is_dir()


def ref_main(tree: Path) -> str:
    """The ref's own dispatcher, as a `python -c` program: where it lives depends on the layout."""
    module = "mavjet.ops.cli" if is_mavjet_layout(tree) else "gateway.cli"
    return f"import sys; from {module} import main; sys.exit(main(sys.argv[1:]))"
# Benchmarks whose nats-server shares the machine with the simulator and the gateway
# (benchmarks/kit.py `nats_and_sim`). Their server gets COLOCATED_GOMAXPROCS through the
# environment, so a ref from before that setting runs its server the same way.
_COLOCATED = frozenset({"commands", "ingest", "mixed", "overload", "uplink"})


def _git(*args: str, cwd: Path) -> str:
    out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"mavjet bench compare: git {' '.join(args)}: {out.stderr.strip() or out.stdout.strip()}")
    return out.stdout.strip()


def _numbers(report: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """Flatten a report to its numeric figures (`ceiling.msgs_per_s` for nested ones)."""
    flat: dict[str, float] = {}
    for key, value in report.items():
        name = f"{prefix}{key}"
        if isinstance(value, bool):
            continue
        if isinstance(value, int | float):
            flat[name] = float(value)
        elif isinstance(value, dict):
            flat.update(_numbers(value, prefix=f"{name}."))
    return flat


def derived(report: dict[str, Any]) -> dict[str, float]:
    """Figures computed from a gateway run's own, for reports of any version that give the inputs.

    `gateway_cpu_us_per_unit_of_work`: the gateway's CPU per MAVLink message plus
    state sample published, which still counts the publishing work of a side
    that shed state (its CPU per MAVLink message does not; see `unequal_work`).
    `gateway_cpu_ms_per_vehicle_s`: the gateway's CPU per vehicle and second,
    the issue's other unit.
    """
    cpu_pct, msgs, state, vehicles = (report.get(k) for k in (
        "gateway_cpu_pct", "mavlink_msgs_per_s", "state_msgs_per_s", "vehicles"))
    out: dict[str, float] = {}
    if not isinstance(cpu_pct, int | float):
        return out
    if isinstance(msgs, int | float) and isinstance(state, int | float) and msgs + state > 0:
        out["gateway_cpu_us_per_unit_of_work"] = round(cpu_pct / 100 * 1e6 / (msgs + state), 3)
    if isinstance(vehicles, int | float) and vehicles > 0:
        out["gateway_cpu_ms_per_vehicle_s"] = round(cpu_pct / 100 * 1e3 / vehicles, 4)
    return out


def summarise(ref_runs: list[dict[str, Any]], new_runs: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per shared numeric figure (and the `derived` ones): the mean of each side and new/ref (None where ref is 0)."""
    ref = [_numbers(r) | derived(r) for r in ref_runs]
    new = [_numbers(r) | derived(r) for r in new_runs]
    keys = [k for k in ref[0] if all(k in r for r in ref) and all(k in n for n in new)] if ref and new else []
    out: dict[str, dict[str, float | None]] = {}
    for key in keys:
        a = mean(r[key] for r in ref)
        b = mean(n[key] for n in new)
        out[key] = {"ref": round(a, 3), "new": round(b, 3), "ratio": round(b / a, 3) if a else None}
    return out


def unequal_work(ref_runs: list[dict[str, Any]], new_runs: list[dict[str, Any]]) -> list[str]:
    """Warnings for runs that did not sustain their configured state rate (a report's `sustained`).

    A gateway that falls behind publishes fewer state samples than configured
    (the new code sheds them before it packs them; docs/performance.md, Overload),
    so its CPU per MAVLink message counts less work than a side that kept up:
    the ratio then flatters the side that shed.
    A comparison of CPU per message is like for like at a fleet size both sides sustain.
    """
    notes = []
    for side, runs in (("ref", ref_runs), ("new", new_runs)):
        short = [r for r in runs if r.get("sustained") is False]
        if short:
            rates = ", ".join(f"{r.get('state_msgs_per_s', 0):.0f}" for r in short)
            expected = short[0].get("state_expected_per_s", 0)
            notes.append(
                f"the {side} side did not sustain its state rate in {len(short)} of {len(runs)} runs "
                f"({rates} of {expected:.0f}/s): it shed work, so CPU per message is not like for like; "
                f"compare at a fleet size both sides sustain"
            )
    return notes


def sim_sources(tree: Path) -> Path:
    """Where a tree's simulator package is: `sim/` of a checkout, or `mavjet/sim` that
    `use_tree_sim` gave a ref from before the `mavjet.*` layout (its own `sim/` is then an alias)."""
    aliased = tree / "mavjet" / "sim"
    return aliased if aliased.is_dir() and not is_mavjet_layout(tree) else tree / "sim"


def sim_digest(tree: Path) -> str:
    """A digest of a tree's simulator sources (`**/*.py` of its sim package, by relative path and content)."""
    h = hashlib.sha256()
    src = sim_sources(tree)
    for path in sorted(src.rglob("*.py")):
        h.update(path.relative_to(src).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


# An old-layout ref's `sim` package, once `use_tree_sim` gave it the working tree's simulator:
# `import sim.X` is `mavjet.sim.X`, the same module object (not a second copy under another name,
# which a compiled module could not be).
_SIM_ALIAS = """\
\"\"\"Written by `mavjet bench compare`: this ref's `sim` is the working tree's `mavjet.sim`.\"\"\"
import importlib
import importlib.abc
import importlib.util
import sys


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self):
        self.real = {}

    def find_spec(self, fullname, path=None, target=None):
        return importlib.util.spec_from_loader(fullname, self) if fullname.startswith("sim.") else None

    def create_module(self, spec):
        module = importlib.import_module("mavjet." + spec.name)
        self.real[spec.name] = module.__spec__
        return module

    def exec_module(self, module):
        for name, spec in self.real.items():  # the import machinery set the alias's spec: put the real one back
            if spec is not None and spec.name == module.__name__:
                module.__spec__ = spec


sys.meta_path.insert(0, _Alias())
"""


def use_tree_sim(root: Path, tree: Path) -> None:
    """The ref's worktree gets the working tree's simulator, so both sides see the same vehicles.

    A `mavjet.*` ref gets it in place of its `sim/`. An older ref, whose
    packages are `gateway`, `sim`, ..., gets it as `mavjet/sim` with the
    working tree's contract beside it (what it imports), and its `sim`
    becomes an alias of it (`_SIM_ALIAS`)."""
    ignore = shutil.ignore_patterns("__pycache__")
    if is_mavjet_layout(tree):
        shutil.rmtree(tree / "sim", ignore_errors=True)
        shutil.copytree(root / "sim", tree / "sim", ignore=ignore)
        return
    for layer in ("sim", "contract"):
        shutil.rmtree(tree / "mavjet" / layer, ignore_errors=True)
        shutil.copytree(root / layer, tree / "mavjet" / layer, ignore=ignore)
    shutil.rmtree(tree / "sim", ignore_errors=True)
    (tree / "sim").mkdir()
    (tree / "sim" / "__init__.py").write_text(_SIM_ALIAS)


def compile_sim(root: Path, dest: Path) -> Path:
    """The working tree's `sim/` with its tick path compiled, alone in `dest/mavjet/sim` (with its mypyc runtime)."""
    print("compiling the simulator's tick path (mavjet compile --sim) ...", flush=True)
    shutil.copytree(root / "sim", dest / "mavjet" / "sim", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    built = build(dest, log=dest / "compile.log", modules=SIM_MODULES)
    print(f"compiled the simulator: {len(built)} extensions", flush=True)
    return dest


def install_sim(sim_dir: Path, tree: Path) -> None:
    """Put a compiled simulator (`compile_sim`) into a ref's worktree, where `use_tree_sim` put the
    source one, and the mypyc runtime beside the packages, where the ref's benchmark imports them from."""
    dest = sim_sources(tree)
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(sim_dir / "mavjet" / "sim", dest, ignore=shutil.ignore_patterns("__pycache__"))
    for runtime in sim_dir.glob("*__mypyc*"):
        if runtime.is_file():
            shutil.copy2(runtime, tree / runtime.name)


def link_layers(tree: Path) -> None:
    """A `mavjet.*` tree gets a `mavjet/` of links to its layer folders: first on PYTHONPATH, it
    then imports as an installed mavjet does (the repository has no folder named mavjet)."""
    if not is_mavjet_layout(tree):
        return
    pkg = tree / "mavjet"
    pkg.mkdir(exist_ok=True)
    for layer in LAYERS:
        if (tree / layer).is_dir() and not (pkg / layer).exists():
            (pkg / layer).symlink_to(Path("..") / layer, target_is_directory=True)


# Imported at the start of every Python process whose PYTHONPATH starts at a ref's tree (site.py
# runs it after the .pth files): it takes out the editable install's finder, which would answer
# for any module the ref lacks with the working tree's module of that name.
_ISOLATE_SITECUSTOMIZE = """\
\"\"\"Written by `mavjet bench compare` into a ref's tree: the ref's processes import only the ref's code.\"\"\"
import sys

sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable___mavjet")]
"""


def isolate_tree(tree: Path, *, pyproject: Path | None = None) -> None:
    """Make a ref's tree (or a compiled copy of it) run only its own code when it goes first on PYTHONPATH.

    The venv holds the working tree as an editable install: its metadata
    names the working tree's entry points (a ref's dispatcher loads its
    commands from those), and its import finder supplies any module the
    ref does not have. A ref whose `gateway` command was `gateway.daemon:main`
    then started the working tree's `gateway/entry.py` over its own
    packages and failed on an import. Here the tree gets the ref's own
    entry points, from its pyproject.toml (`pyproject`, for a compiled copy
    that has none), as a distribution that shadows the installed one, a
    sitecustomize that takes the finder out, and (a `mavjet.*` tree) the
    links that make its folders `mavjet.*` (`link_layers`).
    """
    source = pyproject or tree / "pyproject.toml"
    try:
        project = tomllib.loads(source.read_text()).get("project", {})
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise SystemExit(f"mavjet bench compare: {source}: {e}") from e
    name, version = str(project.get("name", "mavjet")), str(project.get("version", "0"))
    groups: dict[str, dict[str, str]] = {"console_scripts": dict(project.get("scripts", {}))}
    groups.update({g: dict(eps) for g, eps in project.get("entry-points", {}).items()})
    info = tree / f"{name}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n" for group, eps in groups.items() if eps))
    (tree / "sitecustomize.py").write_text(_ISOLATE_SITECUSTOMIZE)
    link_layers(tree)


@contextmanager
def ref_worktree(ref: str) -> Iterator[tuple[Path, Path, str]]:
    """(repository root, a temporary worktree of `ref`, its short sha); the worktree and its
    temporary directory (the rounds' reports, read by then) are removed after. The worktree
    runs only its own code (`isolate_tree`)."""
    root = Path(_git("rev-parse", "--show-toplevel", cwd=Path.cwd()))
    sha = _git("rev-parse", "--short", f"{ref}^{{commit}}", cwd=root)
    tree = Path(tempfile.mkdtemp(prefix="mavjet-compare-")) / "ref"
    _git("worktree", "add", "--detach", str(tree), sha, cwd=root)
    try:
        isolate_tree(tree)
        yield root, tree, sha
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=root, capture_output=True, check=False)
        shutil.rmtree(tree.parent, ignore_errors=True)


def compare(ref: str, name: str, bench_args: list[str], *, rounds: int, out: Path | None = None,
            cpu_hog: int = 0, new_args: list[str] | None = None, ref_sim: str = "tree",
            new_compiled: bool = False, ref_compiled: bool = False, sim_compiled: bool = False) -> int:
    new_args = new_args or []
    if sim_compiled and ref_sim != "tree":
        raise SystemExit("mavjet bench compare: --sim-compiled compiles the working tree's simulator for both "
                         "sides; it does not go with --ref-sim own")
    with ref_worktree(ref) as (root, tree, sha):
        if ref_sim == "tree":
            use_tree_sim(root, tree)
        digests = {"ref": sim_digest(tree), "new": sim_digest(root)}
        sims: dict[str, Any] = {"ref_sim": ref_sim, "sim_digest": digests, "new_compiled": new_compiled,
                                "ref_compiled": ref_compiled, "sim_compiled": sim_compiled}
        whose = "the working tree's on both sides" if ref_sim == "tree" else "each side its own"
        print(f"simulator: {whose} (sim/ {digests['ref']} / {digests['new']})", flush=True)
        # The simulator builds beside the other builds (each is a child process, mostly one core):
        # ~20 s less on a 2-core machine. It goes into the ref's worktree only once the ref's own
        # build, which copies that worktree, is done.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="compile-sim") as pool:
            sim_job = pool.submit(compile_sim, root, tree.parent / "sim-compiled") if sim_compiled else None
            compiled = None
            if new_compiled:
                compiled = tree.parent / "compiled"
                print("compiling a copy of the working tree's hot path (mavjet compile) ...", flush=True)
                built = compile_copy(root, compiled, log=tree.parent / "compile.log")
                print(f"compiled: {len(built)} extensions", flush=True)
            ref_build = compile_ref(ref, tree) if ref_compiled else None
            sim_dir = sim_job.result() if sim_job is not None else None
        if sim_dir is not None:
            install_sim(sim_dir, tree)
        ref_runs, new_runs = _rounds(ref, sha, name, bench_args, rounds=rounds, root=root, tree=tree,
                                     cpu_hog=cpu_hog, new_args=new_args, compiled=compiled, ref_compiled=ref_build,
                                     sim_dir=sim_dir)
    return _table(ref, sha, name, bench_args, rounds=rounds, cpu_hog=cpu_hog, ref_runs=ref_runs, new_runs=new_runs,
                  out=out, new_args=new_args, extra=sims)


def compile_ref(ref: str, tree: Path) -> Path:
    """A compiled copy of the ref's worktree, built by the ref's own `mavjet compile --target`."""
    target = tree.parent / "ref-compiled"
    print(f"compiling a copy of {ref}'s hot path (its own mavjet compile) ...", flush=True)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, "-P", "-c", ref_main(tree), "compile", "--target", str(target)]
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        lines = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        why = lines[-1] if lines else f"exit {proc.returncode}"
        raise SystemExit(f"mavjet bench compare: --ref-compiled: {ref} could not compile itself "
                         f"(it needs `mavjet compile`): {why}")
    print(f"compiled: {proc.stdout.strip().splitlines()[0]}", flush=True)
    isolate_tree(target, pyproject=tree / "pyproject.toml")
    return target


def _rounds(ref: str, sha: str, name: str, bench_args: list[str], *, rounds: int, root: Path, tree: Path,
            cpu_hog: int, new_args: list[str], compiled: Path | None = None,
            ref_compiled: Path | None = None,
            sim_dir: Path | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    tmp = tree.parent
    ref_runs: list[dict[str, Any]] = []
    new_runs: list[dict[str, Any]] = []
    base_env = dict(os.environ)
    if name in _COLOCATED:
        base_env.setdefault("GOMAXPROCS", str(COLOCATED_GOMAXPROCS))
    with cpu_hogs(cpu_hog):  # the same load for both sides, for the whole comparison
        for i in range(1, rounds + 1):
            print(f"round {i}/{rounds}", flush=True)
            # Alternate which side goes first so a drift in machine load does not favour one.
            order = ("ref", "new") if i % 2 else ("new", "ref")
            for side in order:
                report = tmp / f"{side}-{i}.json"
                if side == "ref":
                    # The compiled copy first, then the worktree: an old ref's aliased `sim` is the
                    # working tree's `mavjet.sim`, which only the worktree holds.
                    paths = [str(ref_compiled), str(tree)] if ref_compiled is not None else [str(tree)]
                    env = {**base_env, "PYTHONPATH": os.pathsep.join(paths)}
                    if sim_dir is not None:
                        # A ref that passes -P on to its simulator imports it from PYTHONPATH; one that
                        # does not, from its worktree (its working directory), where install_sim put it.
                        env["PYTHONPATH"] = os.pathsep.join((str(sim_dir), env["PYTHONPATH"]))
                    # -P: the compiled copy, not the worktree's sources (the working directory), first.
                    py = [sys.executable] if ref_compiled is None else [sys.executable, "-P"]
                    cmd = [*py, "-c", ref_main(tree), "bench", name, *bench_args, "--json", str(report)]
                    what = f"{ref} ({sha})" if ref_compiled is None else f"{ref} ({sha}), compiled"
                    ref_runs.append(run_json(what, cmd, cwd=tree, env=env, out=report))
                else:
                    env = {k: v for k, v in base_env.items() if k != "PYTHONPATH"}
                    python = [sys.executable]
                    if compiled is not None:
                        # -P: not the working directory's sources first, the compiled copy on PYTHONPATH.
                        env["PYTHONPATH"], python = str(compiled), [sys.executable, "-P"]
                    if sim_dir is not None:
                        # The compiled simulator first (the benchmark passes -P on to it), then the gateway's code.
                        env["PYTHONPATH"] = os.pathsep.join((str(sim_dir), str(compiled or root)))
                        python = [sys.executable, "-P"]
                    cmd = [*python, "-m", "mavjet.ops", "bench", name, *bench_args, *new_args, "--json", str(report)]
                    label = "working tree" if compiled is None else "working tree, compiled"
                    new_runs.append(run_json(label, cmd, cwd=root, env=env, out=report))
    return ref_runs, new_runs


def _table(ref: str, sha: str, name: str, bench_args: list[str], *, rounds: int, cpu_hog: int,
           ref_runs: list[dict[str, Any]], new_runs: list[dict[str, Any]], out: Path | None,
           new_args: list[str], extra: dict[str, Any] | None = None) -> int:
    table = summarise(ref_runs, new_runs)
    width = max((len(k) for k in table), default=10) + 2
    if new_args:
        print(f"\nthe working tree's side only: {' '.join(new_args)}")
    print(f"\n{'figure':<{width}} {ref + ' (' + sha + ')':>18} {'working tree':>14} {'new/ref':>8}")
    for key, row in table.items():
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.3f}"
        print(f"{key:<{width}} {row['ref']:>18} {row['new']:>14} {ratio:>8}")
    warnings = unequal_work(ref_runs, new_runs)
    for note in warnings:
        print(f"note: {note}")
    path = out or default_json(f"compare-{name}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"ref": ref, "sha": sha, "benchmark": name, "args": bench_args, "rounds": rounds,
                                "cpu_hog": cpu_hog, "new_args": new_args, **(extra or {}), "warnings": warnings,
                                "ref_runs": ref_runs, "new_runs": new_runs, "summary": table}, indent=2))
    print(f"wrote {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mavjet bench compare",
        usage="mavjet bench compare [-h] [--rounds N] [--json FILE] [--new-arg ARG ...] [--new-compiled] [--ref-compiled] "
              "[--sim-compiled] [--ref-sim tree|own] REF -- NAME [options]",
        description="Run a benchmark from a git ref and from the working tree alternately; print both and the ratio.",
        epilog="example: mavjet bench compare HEAD~5 --rounds 2 -- ingest --vehicles 1000 --duration 10",
    )
    p.add_argument("ref", help="git ref of the code to compare against (a commit, tag or branch)")
    p.add_argument("--rounds", type=positive_int, default=2, help="runs of each side (default %(default)s)")
    p.add_argument("--json", type=Path, default=None, help="write the comparison here "
                   "(default: benchmarks/results/compare-NAME-STAMP.json in a checkout, docs/benchmarks.md)")
    p.add_argument("--cpu-hog", type=non_negative_int, default=0, metavar="K",
                   help="K busy processes load the machine for the whole comparison (both sides alike)")
    p.add_argument("--new-arg", action="append", default=[], metavar="ARG",
                   help="an option for the working tree's side only, repeatable; e.g. --new-arg=--uvloop: "
                        "the edge hub as deployed now against today's on asyncio")
    p.add_argument("--new-compiled", action="store_true",
                   help="the working tree's side from a copy with its hot path compiled by mypyc (mavjet compile; "
                        "needs mypy and a C compiler), the ref's as it was")
    p.add_argument("--ref-compiled", action="store_true",
                   help="the ref's side compiled too, by its own mavjet compile (a ref that has the command): "
                        "with --new-compiled, compiled code against compiled code")
    p.add_argument("--sim-compiled", action="store_true",
                   help="both sides' simulator with its tick path compiled (mavjet compile --sim): it shares the "
                        "cores with the gateway, and compiled it takes about a third less of them")
    p.add_argument("--ref-sim", choices=("tree", "own"), default="tree",
                   help="the simulated vehicles of the ref's side: the working tree's sim/ (default: both sides "
                        "see the same traffic) or the ref's own")
    return p


def main(argv: list[str]) -> int:
    p = build_parser()
    # Everything after `--` is the benchmark's: split before argparse sees it.
    cut = argv.index("--") if "--" in argv else len(argv)
    args = p.parse_args(argv[:cut])
    rest = argv[cut + 1:]
    if not rest:
        p.error("name the benchmark after --, e.g. -- ingest --vehicles 100")
    if "--json" in rest:
        p.error("the benchmark's --json is set by compare; use compare's own --json")
    return compare(args.ref, rest[0], rest[1:], rounds=args.rounds, out=args.json, cpu_hog=args.cpu_hog,
                   new_args=args.new_arg, ref_sim=args.ref_sim, new_compiled=args.new_compiled,
                   ref_compiled=args.ref_compiled, sim_compiled=args.sim_compiled)
