"""The companion computer's systemd unit: verified by systemd itself where available."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mavjet.ops.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "deploy" / "systemd" / "mavjet-gateway.service"
SYSUSERS = ROOT / "deploy" / "systemd" / "mavjet.sysusers.conf"
INSTALLED_EXE = "/opt/mavjet/bin/mavjet"


def unit_values() -> dict[str, dict[str, list[str]]]:
    """Unit file -> {section: {key: [values...]}} (keys may repeat)."""
    out: dict[str, dict[str, list[str]]] = {}
    section = ""
    for raw in UNIT.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            out.setdefault(section, {})
            continue
        key, _, value = line.partition("=")
        out[section].setdefault(key.strip(), []).append(value.strip())
    return out


def test_unit_structure() -> None:
    u = unit_values()
    svc = u["Service"]
    one = {k: v[-1] for k, v in svc.items()}
    assert one["Type"] == "notify"
    assert one["NotifyAccess"] == "main"
    assert re.fullmatch(r"\d+s", one["WatchdogSec"]) and int(one["WatchdogSec"][:-1]) >= 10
    assert one["Restart"] == "always" and one["RestartSec"]
    assert "StartLimitBurst" in u["Unit"] and "StartLimitIntervalSec" in u["Unit"]
    assert one["User"] == "mavjet" or one.get("DynamicUser") == "yes"
    assert one["ProtectSystem"] == "strict"
    assert one["StateDirectory"] == "mavjet"
    assert one["NoNewPrivileges"] == "yes"
    assert svc["CapabilityBoundingSet"] == [""]  # empty: no capabilities at all
    assert one["DevicePolicy"] == "closed" and svc["DeviceAllow"]
    exec_start = one["ExecStart"].split()
    assert exec_start[0] == INSTALLED_EXE and exec_start[1] == "gateway" and "gateway" in COMMANDS
    assert "--config" in exec_start and exec_start[exec_start.index("--config") + 1] == "/etc/mavjet/gateway.toml"
    assert "multi-user.target" in u["Install"]["WantedBy"]
    # The dedicated user exists via sysusers and can open serial ports.
    lines = [ln.split() for ln in SYSUSERS.read_text().splitlines() if ln and not ln.startswith("#")]
    assert lines[0][:2] == ["u", "mavjet"] and ["m", "mavjet", "dialout"] in lines


def _installable_copy(tmp_path: Path) -> Path:
    """The unit with ExecStart pointing at this environment's `mavjet` (verify checks it exists)."""
    exe = Path(sys.executable).parent / "mavjet"
    if not exe.exists():
        pytest.skip("the mavjet console script is not installed in this environment")
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace(INSTALLED_EXE, str(exe)))
    return unit


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verify(tmp_path: Path) -> None:
    unit = _installable_copy(tmp_path)
    out = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True,
                         timeout=60, check=False)
    # Unknown keys are only warnings (exit 0): treat any output as a failure.
    assert out.returncode == 0 and out.stderr.strip() == "" and out.stdout.strip() == "", out.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verify_catches_mistakes(tmp_path: Path) -> None:
    """The check above can fail: a misspelt key is reported."""
    unit = _installable_copy(tmp_path)
    unit.write_text(unit.read_text().replace("Restart=always", "Restartt=always"))
    out = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True,
                         timeout=60, check=False)
    assert "Restartt" in out.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_hardening_exposure_is_low(tmp_path: Path) -> None:
    unit = _installable_copy(tmp_path)
    out = subprocess.run(["systemd-analyze", "security", "--offline=true", str(unit)],
                         capture_output=True, text=True, timeout=60, check=False)
    m = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", out.stdout)
    if m is None and "--offline" in out.stderr:
        pytest.skip("this systemd-analyze has no offline security analysis")
    assert m is not None, out.stdout + out.stderr
    # systemd rates 0..10 (10 = unprotected); <= 2.5 is "OK" territory.
    assert float(m.group(1)) <= 2.5


def test_configparser_reads_unit() -> None:
    """Plain INI structure (what non-systemd tools such as packagers see) is sound."""
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read_string(UNIT.read_text())
    assert cp.sections() == ["Unit", "Service", "Install"]
