"""`mavjet compile`: the gateway's per-message hot path compiled to C extensions with mypyc.

The gateway is interpreter-bound per MAVLink message (docs/performance.md).
mypyc, the mypy project's compiler, turns the type-annotated modules that
every message crosses (the framer, the reactor, the telemetry model, the
twin's sample path, the state publisher) into C extensions that do the same
thing with less interpreter work: 6 to 9 % less gateway CPU per MAVLink message
(docs/benchmarks.md). The code stays pure Python; a compiled module sits next to its
source and Python imports it first, so an install without a compiler runs the
same code, interpreted.

    mavjet compile                # in place, in an installed (non-editable) mavjet
    mavjet compile --target DIR   # a compiled copy of the packages in DIR: PYTHONPATH=DIR mavjet ...
    mavjet compile --check        # which hot modules run compiled here; exit 1 if any does not
    mavjet compile --target DIR --sim   # the simulator's tick path too, for load tests

`--sim` also compiles the simulator's per-vehicle tick (`SIM_MODULES`): in
a benchmark the simulator shares the machine with the gateway and took ~0.9
of a core at 2,000 vehicles on a slow host; compiled it takes about a third
less (docs/benchmarks.md). A deployment does not run the simulator, so it is
not compiled unless asked for.

It needs mypy (which ships mypyc), a C compiler and Python's headers, only
while it builds. A source checkout is never compiled in place: a compiled
module would shadow the source beside it, and an edit would not run until the
next build (use --target; `mavjet bench compare --new-compiled` does).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

from mavjet.contract.errors import MavjetError
from mavjet.ops.runner import run_cli

# The modules every MAVLink message and state sample crosses, by module name: the one place the
# compiled set is declared (tests/ops/test_compile.py fails when a name here is not a module, or
# does not run compiled from a compiled copy, and runs their tests on the compiled build). The light
# message classes (drivers/mavlink/light.py) stay interpreted: they are made with type() at import,
# which mypyc cannot compile.
HOT_MODULES: tuple[str, ...] = (
    "mavjet.drivers.mavlink.framer",
    "mavjet.drivers.mavlink.reactor",
    "mavjet.drivers.mavlink.codec",
    "mavjet.drivers.mavlink.inbound",
    "mavjet.gateway.twin.telemetry",
    "mavjet.gateway.twin.samples",
    "mavjet.gateway.twin.vehicle",
    "mavjet.gateway.publish.statepub",
    "mavjet.gateway.publish.publisher",
)
# The simulator's per-vehicle tick (`mavjet compile --sim`): its physics, its stream schedule,
# its telemetry and their framing, and the vehicle class that drives them (mypyc cannot let an
# interpreted class inherit a compiled one, so sim/vehicle.py must go with sim/model.py).
SIM_MODULES: tuple[str, ...] = (
    "mavjet.sim.state",  # the base class of sim/model.py's VehicleModel: compiled with it
    "mavjet.sim.health",
    "mavjet.sim.telemetry",
    "mavjet.sim.flight",
    "mavjet.sim.control",
    "mavjet.sim.lifecycle",
    "mavjet.sim.model",
    "mavjet.sim.encoder",
    "mavjet.sim.streams",
    "mavjet.sim.vehicle",
)
# What a compiled copy (--target) holds: every layer the `mavjet` commands import, each a folder
# of the checkout imported as mavjet.<folder> (pyproject.toml's package-dir).
LAYERS: tuple[str, ...] = ("contract", "drivers", "gateway", "ops", "sim", "analytics", "benchmarks")
# And the data a checkout's packages find beside them (an installed mavjet finds it under its prefix):
# ops/provision.py looks for deploy/jetstream beside the layers.
DATA: tuple[str, ...] = ("deploy/jetstream",)
# mypy's own strictness is the repository's gate (`make test`); here it only has to type the
# modules, whatever stubs the installing environment has.
# `mavjet` is a namespace package (no __init__.py): mypyc names a module by its path from the
# build's working directory only with explicit package bases.
_MYPY_FLAGS: tuple[str, ...] = ("--ignore-missing-imports", "--follow-imports=silent", "--explicit-package-bases")
BUILD_TIMEOUT_S = 900.0  # ~35 s on a 2-core machine; a slow ARM companion takes several minutes

# Run in a child process with the packages' root as its working directory: mypyc names modules
# by their paths from there, and setuptools then builds them in place.
_BUILD = """
import sys
from setuptools import setup
from mypyc.build import mypycify
build = sys.argv.pop(1)
flags_and_paths = sys.argv[1:]
sys.argv[1:] = ["build_ext", "--inplace", "--build-temp", build + "/temp", "--build-lib", build + "/lib"]
setup(name="mavjet-compiled", ext_modules=mypycify(flags_and_paths, opt_level="3", target_dir=build + "/c"))
"""


class CompileError(MavjetError):
    """The hot path could not be compiled (no mypyc, no compiler, a module mypyc refuses)."""


def module_path(name: str) -> str:
    """`mavjet.gateway.twin.vehicle` -> `mavjet/gateway/twin/vehicle.py`, its path under a packages root."""
    return name.replace(".", "/") + ".py"


def packages_root() -> Path:
    """Where this mavjet's layers are imported from: the directory holding `mavjet/` (site-packages,
    a compiled copy), or a source checkout's root (its layer folders are mapped to `mavjet.*`)."""
    spec = importlib.util.find_spec("mavjet.contract")
    if spec is None or spec.origin is None:  # pragma: no cover - this module is part of it
        raise CompileError("cannot find the mavjet.contract package")
    parent = Path(spec.origin).resolve().parent.parent
    return parent if is_source_checkout(parent) else parent.parent


def is_source_checkout(root: Path) -> bool:
    return (root / "pyproject.toml").is_file() and all((root / layer).is_dir() for layer in ("contract", "gateway"))


def compiled_modules() -> dict[str, bool]:
    """Each hot module: True when this interpreter imports it compiled (an extension module, stale or not)."""
    return {name: state != "interpreted" for name, state in module_states().items()}


def _extensions(module_path: Path) -> list[Path]:
    """The extension modules this interpreter would load for the module at `module_path` (`x/y.py`).

    By this interpreter's own suffixes: an extension built for another Python
    version beside it is not one it would import."""
    stem = module_path.with_suffix("")
    return [ext for suffix in EXTENSION_SUFFIXES if (ext := stem.with_name(stem.name + suffix)).is_file()]


def module_states() -> dict[str, str]:
    """Each hot module: "compiled", "interpreted", or "stale" (an extension older than its source)."""
    out: dict[str, str] = {}
    for name in HOT_MODULES:
        spec = importlib.util.find_spec(name)
        origin = "" if spec is None or spec.origin is None else spec.origin
        state = "compiled" if origin.endswith(tuple(EXTENSION_SUFFIXES)) else "interpreted"
        if state == "compiled":
            # Python imports the extension before the source beside it: a source changed since
            # the build (an edit, a reinstall that left the extension) would not run.
            ext, src = Path(origin), Path(origin).parent / Path(module_path(name)).name
            if src.is_file() and src.stat().st_mtime > ext.stat().st_mtime:
                state = "stale"
        out[name] = state
    return out


def record_in_install(root: Path, built: list[Path]) -> bool:
    """Name the extensions in the installed distribution's RECORD, so `pip uninstall` and an
    upgrade remove them with the sources (an extension left behind would shadow the new source).
    False when mavjet was not installed from a wheel (no RECORD under `root`)."""
    try:
        dist = importlib.metadata.distribution("mavjet")
    except importlib.metadata.PackageNotFoundError:
        return False
    record = Path(str(dist.locate_file(""))) / f"{dist.metadata['Name']}-{dist.version}.dist-info" / "RECORD"
    if not record.is_file():
        return False
    listed = set(record.read_text().splitlines())
    lines = [f"{p.relative_to(root).as_posix()},," for p in built]
    new = [ln for ln in lines if ln not in listed]
    if new:
        with record.open("a") as f:
            f.write("".join(ln + "\n" for ln in new))
    return True


def copy_packages(src_root: Path, target: Path) -> None:
    """The layers' Python sources, without bytecode or earlier builds, into `target/mavjet/`.

    From a checkout each layer folder becomes `mavjet/<folder>` (and the data goes beside them);
    from an installed root or a compiled copy, its `mavjet/` is copied as it is."""
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.pyd")
    if not is_source_checkout(src_root):
        shutil.copytree(src_root / "mavjet", target / "mavjet", ignore=ignore, dirs_exist_ok=True)
        return
    for name in (*LAYERS, *DATA):
        if (src_root / name).is_dir():
            shutil.copytree(src_root / name, target / "mavjet" / name, ignore=ignore, dirs_exist_ok=True)


def build(root: Path, *, log: Path | None = None, modules: tuple[str, ...] = HOT_MODULES) -> list[Path]:
    """Compile `modules` in place under `root` (a directory holding the packages); the extensions built."""
    return build_groups(root, [(modules, log)])


def build_groups(root: Path, groups: list[tuple[tuple[str, ...], Path | None]]) -> list[Path]:
    """Compile each group of modules (with its log file) in place under `root`, the groups at once.

    Each group is one mypyc build with its own shared runtime (`<hash>__mypyc`), so the
    simulator's group can be built, and copied elsewhere, apart from the gateway's; run side by
    side they take the time of the longer one on a machine with two cores."""
    if importlib.util.find_spec("mypyc") is None:
        raise CompileError("mypyc is not installed: pip install mypy (it ships mypyc), then run this again")
    missing = [module_path(m) for modules, _ in groups for m in modules if not (root / module_path(m)).is_file()]
    if missing:
        raise CompileError(f"{root} does not hold {', '.join(missing)}")
    # A clean environment for the compiler's children: MYPYPATH or a stray PYTHONPATH would
    # type the modules against other sources than the ones being built.
    env = {k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "PYTHONPATH")}
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="mavjet-compile-") as tmp:
        procs: list[subprocess.Popen[bytes]] = []
        logs = [Path(tmp) / f"{i}.out" for i in range(len(groups))]
        try:
            for i, (modules, _) in enumerate(groups):
                # Each group its own mypy cache: two builds side by side in one directory would
                # share `.mypy_cache`, whose SQLite file one of them then finds locked.
                cmd = [sys.executable, "-c", _BUILD, f"{tmp}/{i}", *_MYPY_FLAGS, f"--cache-dir={tmp}/{i}/mypy-cache",
                       *map(module_path, modules)]
                with logs[i].open("wb") as out:  # a file, not a pipe: a group's output never blocks it
                    procs.append(subprocess.Popen(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT))
            deadline = time.monotonic() + BUILD_TIMEOUT_S
            for proc in procs:
                try:
                    proc.wait(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired as exc:
                    raise CompileError(f"the build took longer than {BUILD_TIMEOUT_S:.0f} s") from exc
        finally:
            for proc in procs:  # one group timed out: the others do not outlive the call
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        outputs = [f.read_text(errors="replace") for f in logs]
    for (_, log), proc, output in zip(groups, procs, outputs, strict=True):
        if log is not None:
            log.write_text(output)
        if proc.returncode != 0:
            # mypy's "file:line: error: ...", or the compiler's; not the command lines (they carry -Werror).
            lines = output.splitlines()
            errors = [ln for ln in lines if ": error" in ln or ln.startswith(("error", "Error"))] or lines
            raise CompileError(f"the build failed: {errors[-1] if errors else f'exit {proc.returncode}'}")
    # The groups' mypyc runtimes: the ones these builds wrote (a runtime from an earlier build is older).
    built = [ext for ext in _runtimes(root) if ext.stat().st_mtime >= started]
    for modules, _ in groups:
        for name in modules:
            ext = _extensions(root / module_path(name))
            if not ext:
                raise CompileError(f"the build made no extension for {name}")
            built += ext
    return sorted(built)


def _runtimes(root: Path) -> list[Path]:
    return [ext for suffix in EXTENSION_SUFFIXES for ext in root.glob(f"*__mypyc{suffix}")]


def compile_copy(src_root: Path, target: Path, *, log: Path | None = None, sim: bool = False) -> list[Path]:
    """A compiled copy of the packages under `src_root` in `target` (created, or refreshed);
    with `sim`, the simulator's tick path compiled too (beside the gateway's, at once)."""
    target.mkdir(parents=True, exist_ok=True)
    copy_packages(src_root, target)
    groups: list[tuple[tuple[str, ...], Path | None]] = [(HOT_MODULES, log)]
    if sim:
        groups.append((SIM_MODULES, None if log is None else log.with_suffix(".sim.log")))
    return build_groups(target, groups)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mavjet compile",
        description="Compile the gateway's per-message hot path with mypyc (needs mypy, a C compiler and "
                    "Python's headers while it builds). Without it mavjet runs the same code, interpreted.",
        epilog="examples:\n  mavjet compile --check\n  mavjet compile                    (an installed mavjet)\n"
               "  mavjet compile --target /opt/mavjet-compiled && PYTHONPATH=/opt/mavjet-compiled mavjet gateway ...\n"
               "  mavjet compile --target DIR --sim  (load tests: PYTHONPATH=DIR python -P -m mavjet.ops bench ...)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--target", type=Path, metavar="DIR",
                   help="build a compiled copy of the packages here instead of compiling the installed ones")
    p.add_argument("--check", action="store_true",
                   help="print which hot modules run compiled here; exit 0 if all do, 1 if any runs interpreted or stale")
    p.add_argument("--log", type=Path, metavar="FILE", help="write the compiler's whole output here")
    p.add_argument("--sim", action="store_true",
                   help="also compile the simulator's per-vehicle tick (sim/), for load tests and benchmarks where "
                        "it shares the machine with the gateway; a deployment does not run it")
    return p


def run(args: argparse.Namespace) -> int:
    if args.check:
        states = module_states()
        for name, state in states.items():
            print(f"{state:<12} {name}")
        if "stale" in states.values():
            print("stale: an extension is older than its source; run mavjet compile again", file=sys.stderr)
        return 0 if all(state == "compiled" for state in states.values()) else 1
    root = packages_root()
    if args.target is None:
        if is_source_checkout(root):
            raise CompileError(f"{root} is a source checkout: compiled modules would shadow your edits; "
                               "use --target DIR (or install mavjet without -e)")
        groups: list[tuple[tuple[str, ...], Path | None]] = [(HOT_MODULES, args.log)]
        if args.sim:
            groups.append((SIM_MODULES, None))
        built = build_groups(root, groups)
        where = str(root)
        if not record_in_install(root, built):
            print("note: no wheel RECORD found: remove the extensions (*.so beside the hot modules) "
                  "before upgrading mavjet", file=sys.stderr)
    else:
        if args.target.resolve() == root:
            raise CompileError("--target is where mavjet is imported from; leave --target out to compile in place")
        built = compile_copy(root, args.target, log=args.log, sim=args.sim)
        where = str(args.target)
    modules = len(HOT_MODULES) + (len(SIM_MODULES) if args.sim else 0)
    print(f"compiled {modules} modules ({len(built)} extensions) in {where}")
    if args.target is not None:
        print(f"run it with: PYTHONPATH={args.target} mavjet ...")
    return 0


def main(argv: list[str]) -> int:
    return run_cli(build_parser(), run, argv)
