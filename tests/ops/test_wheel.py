"""One installed name: the wheel holds only `mavjet`, and installed from it mavjet runs.

The repository keeps a folder per layer (contract/, drivers/, gateway/, ops/,
sim/, analytics/, benchmarks/), mapped to `mavjet.<folder>` by pyproject.toml's
package-dir; the packages are listed there by hand, so a new subpackage must
be listed too (checked here), or the wheel would lack it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

from mavjet.ops.compile import LAYERS

ROOT = Path(__file__).resolve().parents[2]
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _folder(package: str) -> Path:
    """`mavjet.gateway.twin` -> the checkout's gateway/twin (through package-dir)."""
    layer, _, rest = package.removeprefix("mavjet.").partition(".")
    return ROOT / SETUPTOOLS["package-dir"][f"mavjet.{layer}"] / rest.replace(".", "/")


def test_every_package_of_every_layer_is_listed_for_the_wheel() -> None:
    listed = set(SETUPTOOLS["packages"])
    on_disk = {"mavjet." + ".".join(p.parent.relative_to(ROOT).parts)
               for folder in SETUPTOOLS["package-dir"].values() for p in (ROOT / folder).rglob("__init__.py")}
    data_only = {p for p in listed if not (_folder(p) / "__init__.py").is_file()}
    assert on_disk == listed - data_only, "list every package in pyproject.toml [tool.setuptools] packages"
    assert data_only == {"mavjet.sim.plans"} and list((_folder("mavjet.sim.plans")).glob("*.plan"))
    assert set(SETUPTOOLS["package-dir"]) == {f"mavjet.{f}" for f in SETUPTOOLS["package-dir"].values()}
    # The compiled copy holds the same layers (ops/compile.py lists them for an install without pyproject).
    assert set(LAYERS) == set(SETUPTOOLS["package-dir"].values())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(ROOT)],
                          capture_output=True, text=True, timeout=240, check=False)
    if proc.returncode != 0 and "No matching distribution" in proc.stderr:
        pytest.skip(f"the build backend could not be installed: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    (built,) = out.glob("mavjet-*.whl")
    return built


@pytest.mark.timeout(300)
def test_the_wheels_only_top_level_name_is_mavjet(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names}
    assert {t for t in tops if not t.startswith("mavjet-0")} == {"mavjet"}, tops
    assert "mavjet/__init__.py" not in names  # a namespace package: the layers are its only content
    for package in SETUPTOOLS["packages"]:
        for src in _folder(package).glob("*.py"):
            assert f"{package.replace('.', '/')}/{src.name}" in names, src
    assert "mavjet/sim/plans/demo.plan" in names and "mavjet/gateway/py.typed" in names


@pytest.mark.timeout(300)
def test_installed_from_the_wheel_it_runs(wheel: Path, tmp_path: Path) -> None:
    """A clean venv with only the wheel, its dependencies seen from this one's site-packages
    (added as a path, so this venv's editable install, a .pth hook, stays out)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    vpy = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(vpy), "install", "-q", "--no-deps", str(wheel)],
                   check=True, timeout=120, capture_output=True)
    site = Path(subprocess.run([str(vpy), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True, timeout=30).stdout.strip())
    (site / "zz-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    mavjet = str(venv / "bin" / "mavjet")

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, timeout=90, cwd=tmp_path, env=env, check=False)

    where = run(str(vpy), "-c", "import mavjet.gateway.daemon as d, mavjet.contract as c; print(d.__file__, c.__version__)")
    assert where.returncode == 0 and where.stdout.startswith(str(site / "mavjet" / "gateway")), where
    for argv in (("gateway", "--help"), ("replay", "--help"), ("sim", "--help")):
        proc = run(mavjet, *argv)
        assert proc.returncode == 0 and "usage: mavjet" in proc.stdout, (argv, proc.stderr[-1000:])
    # The simulator flies from the installed package (its plans are package data).
    with subprocess.Popen([mavjet, "sim", "--vehicles", "1", "--base-port", "0"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=env) as sim:
        assert sim.stdout is not None
        try:
            lines = [sim.stdout.readline().strip() for _ in range(2)]  # bounded: the vehicle, then ready
        finally:
            sim.terminate()
            sim.wait(timeout=30)
    assert lines[-1].startswith("ready vehicles=1"), lines
