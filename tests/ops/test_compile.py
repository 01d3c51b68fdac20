"""`mavjet compile`: the hot path compiled with mypyc behaves as the interpreted one.

The compiled copy is built for real (mypyc, the machine's C compiler) and the
hot modules' own tests run against it in a child pytest; a machine without a
compiler or Python's headers skips them and says why.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mavjet.ops import compile as mjc
from tests.support.compiled import cannot_compile

ROOT = Path(__file__).resolve().parents[2]

# The hot modules' own tests, and a gateway end to end. A test that patches a compiled module
# is skipped in the child, saying why (tests/support/compiled.py).
HOT_TESTS = (
    "tests/drivers/test_fastdecode.py",
    "tests/drivers/test_framer.py",
    "tests/drivers/test_codec.py",
    "tests/drivers/test_inbound.py",
    "tests/drivers/test_reactor.py",
    "tests/gateway/test_telemetry.py",
    "tests/gateway/test_ready_states.py",
    "tests/gateway/test_ticker_steps.py",  # the fleet ticker in steps through the compiled collect_fleet_*
    "tests/gateway/test_superseded.py",
    "tests/gateway/test_publisher_raw.py",
    "tests/gateway/test_direct_delivery.py",
    "tests/gateway/test_publisher_direct.py",  # the event path (eventpub.EventPath) the compiled Publisher makes
    "tests/test_natsadapter.py",  # the compiled publisher on nats-py's public API (an unverified version)
    "tests/gateway/test_telemetry_twin.py",  # a gateway with its twins, a simulator and a nats-server
    "tests/commands/test_safety.py",  # commands end to end: deadlines, one result each, through the publisher
    # The simulator's tick path (mavjet compile --sim): its units, its streams and its fidelity to
    # the recorded ArduCopter; the tests above drive the compiled simulator too.
    "tests/sim/test_units.py",
    "tests/sim/test_telemetry.py",
    "tests/sim/test_fidelity.py",
)


def _mavjet(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-P", "-m", "mavjet.ops", "compile", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env=env, check=False)


def _checkout_path(name: str) -> Path:
    """`mavjet.gateway.twin.samples` -> the checkout's gateway/twin/samples.py (its layer is a folder)."""
    return ROOT / mjc.module_path(name).removeprefix("mavjet/")


def test_hot_modules_exist_and_are_named_as_modules() -> None:
    """The compiled set is declared by module name: a name that is not a module fails here."""
    for name in (*mjc.HOT_MODULES, *mjc.SIM_MODULES):
        assert name.startswith("mavjet."), name
        assert _checkout_path(name).is_file(), name
        assert mjc.importlib.util.find_spec(name) is not None, name
    assert mjc.module_path("mavjet.gateway.twin.samples") == "mavjet/gateway/twin/samples.py"
    for test in HOT_TESTS:
        assert (ROOT / test).is_file(), test


def test_check_says_the_source_checkout_runs_interpreted() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = _mavjet("--check", env={**env, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 1, proc.stderr  # any module interpreted: a script can tell
    lines = proc.stdout.splitlines()
    assert len(lines) == len(mjc.HOT_MODULES)
    assert all(line.split()[0] == "interpreted" for line in lines), proc.stdout


def test_a_source_checkout_is_not_compiled_in_place() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = _mavjet(env={**env, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "source checkout" in proc.stderr and "--target" in proc.stderr
    assert not [so for layer in mjc.LAYERS for so in (ROOT / layer).rglob("*.so")]


def test_without_mypyc_the_error_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = mjc.importlib.util.find_spec
    monkeypatch.setattr(mjc.importlib.util, "find_spec", lambda name, *a: None if name == "mypyc" else real(name, *a))
    with pytest.raises(mjc.CompileError, match="pip install mypy"):
        mjc.compile_copy(ROOT, tmp_path / "copy")


def test_extensions_built_in_place_join_the_wheels_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pip removes what RECORD names: an upgrade must not leave an extension to shadow the new source."""
    site = tmp_path / "site"
    info = site / "mavjet-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mavjet\nVersion: 0.1.0\n")
    (info / "RECORD").write_text("mavjet/gateway/twin/samples.py,sha256=x,10\n")
    dist = importlib.metadata.PathDistribution(info)
    monkeypatch.setattr(mjc.importlib.metadata, "distribution", lambda name: dist)
    so = "mavjet/gateway/twin/samples.cpython-311-x86_64-linux-gnu.so"
    built = [site / so, site / "abc__mypyc.cpython-311-x86_64-linux-gnu.so"]
    assert mjc.record_in_install(site, built)
    assert mjc.record_in_install(site, built)  # a second build adds nothing twice
    lines = (info / "RECORD").read_text().splitlines()
    assert lines == ["mavjet/gateway/twin/samples.py,sha256=x,10", f"{so},,",
                     "abc__mypyc.cpython-311-x86_64-linux-gnu.so,,"]
    assert {str(f) for f in dist.files or []} >= {so}


@pytest.mark.timeout(300)
def test_a_module_mypyc_refuses_fails_the_build_with_its_error(tmp_path: Path) -> None:
    """The one line names mypyc's complaint (file and line), not a compiler command line."""
    mjc.copy_packages(ROOT, tmp_path)
    samples = tmp_path / "mavjet" / "gateway" / "twin" / "samples.py"
    samples.write_text(samples.read_text() + "\n\nclass _Refused(tuple[int, ...]):\n    pass\n")
    with pytest.raises(mjc.CompileError) as caught:
        mjc.build(tmp_path, log=tmp_path / "build.log")
    message = str(caught.value)
    assert message.startswith("the build failed: mavjet/gateway/twin/samples.py:") and ": error:" in message
    assert "gcc" not in message
    assert not list((tmp_path / "mavjet").glob("**/*.so"))


@pytest.fixture(scope="module")
def compiled_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    why = cannot_compile()
    if why is not None:
        pytest.skip(f"cannot build C extensions here: {why}")
    target = tmp_path_factory.mktemp("compiled")
    built = mjc.compile_copy(ROOT, target, log=target / "compile.log", sim=True)
    # One extension a module, and a shared mypyc runtime for each of the two groups.
    runtimes = [p for p in built if "__mypyc" in p.name]
    assert len(runtimes) == 2 and len(built) == len(mjc.HOT_MODULES) + len(mjc.SIM_MODULES) + 2, built
    return target


@pytest.mark.timeout(120)
def test_the_compiled_simulator_says_so_when_ready(compiled_copy: Path, tmp_path: Path) -> None:
    """`ready vehicles=N compiled=K`: a benchmark reports whether its simulator ran compiled."""
    from mavjet.sim.cli import compiled_from_ready

    env = {**os.environ, "PYTHONPATH": str(compiled_copy)}
    with subprocess.Popen([sys.executable, "-P", "-m", "mavjet.ops", "sim", "--vehicles", "1", "--base-port", "0"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=env) as proc:
        assert proc.stdout is not None
        try:
            lines = [proc.stdout.readline().strip() for _ in range(2)]  # bounded: the vehicle, then ready
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    assert lines[-1] == f"ready vehicles=1 compiled={len(mjc.SIM_MODULES)}", lines
    assert compiled_from_ready(lines[-1]) == len(mjc.SIM_MODULES)
    # `mavjet sim bench` run from the compiled copy measures that copy's simulator (it passes -P on).
    bench = subprocess.run([sys.executable, "-P", "-m", "mavjet.ops", "sim", "bench", "-n", "2", "--duration", "1",
                            "--warmup", "0.5"], capture_output=True, text=True, timeout=90, cwd=tmp_path, env=env,
                           check=False)
    assert bench.returncode == 0, bench.stderr[-2000:]
    measured = json.loads(bench.stdout.strip().splitlines()[-1])
    assert measured["sim_modules_compiled"] == len(mjc.SIM_MODULES) and measured["crc_errors"] == 0


@pytest.mark.timeout(600)
def test_the_compiled_copy_imports_compiled_and_passes_the_hot_modules_tests(compiled_copy: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(compiled_copy)}
    check = _mavjet("--check", env=env)
    assert check.returncode == 0, check.stderr
    assert [line.split()[0] for line in check.stdout.splitlines()] == ["compiled"] * len(mjc.HOT_MODULES)
    # The checkout's own sources must not come first: -P, and pytest appends the rootdir.
    proc = subprocess.run(
        [sys.executable, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--import-mode=append", *HOT_TESTS],
        capture_output=True, text=True, timeout=540, cwd=ROOT, env=env, check=False,
    )
    tail = "\n".join(proc.stdout.splitlines()[-15:])
    assert proc.returncode == 0, tail
    assert " passed" in tail and "failed" not in tail
    # A source edited after the build would not run: --check calls its extension stale.
    src = compiled_copy / "mavjet" / "gateway" / "twin" / "samples.py"
    later = time.time() + 3600  # after the build, whenever the checkout's files were written
    os.utime(src, (later, later))
    stale = _mavjet("--check", env=env)
    assert stale.returncode == 1
    assert "stale        mavjet.gateway.twin.samples" in stale.stdout and "mavjet compile again" in stale.stderr
