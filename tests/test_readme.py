"""The README's examples run as written (against a real nats-server and sim)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mavjet.ops.demo import pick_base_port
from mavjet.ops.natsserver import NatsServer

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _examples() -> list[str]:
    blocks = re.findall(r"```console\n(.*?)```", README, re.S)
    return [line[2:] for block in blocks for line in block.splitlines() if line.startswith("$ ")]


def _mavjet(cmd: str) -> list[str]:
    argv = shlex.split(cmd.rstrip("&").strip())
    assert argv[0] == "mavjet"
    return [sys.executable, "-m", "mavjet.ops", *argv[1:]]


def test_readme_has_examples() -> None:
    ex = _examples()
    assert any(e.startswith("mavjet gateway") for e in ex) and any(e.startswith("mavjet twin") for e in ex)


def test_every_subcommand_has_help() -> None:
    out = subprocess.run([sys.executable, "-m", "mavjet.ops", "--help"], capture_output=True, text=True, timeout=60, check=True)
    names = re.findall(r"^  (\w+) ", out.stdout, re.M)
    assert {"gateway", "provision", "demo", "sim", "twin", "events", "fleet"} <= set(names)
    for name in names:  # every command `mavjet --help` lists
        r = subprocess.run([sys.executable, "-m", "mavjet.ops", name, "--help"], capture_output=True, text=True,
                           timeout=60, check=False)
        assert r.returncode == 0 and "usage:" in r.stdout, (name, r.stderr)
        assert "Traceback" not in r.stderr, (name, r.stderr)


def test_readme_walkthrough(nats_server: NatsServer, tmp_path: Path) -> None:
    """Run the README's console example top to bottom, with ports moved to free ones."""
    base = pick_base_port(2, preferred=25760)
    env = dict(os.environ, MAVJET_NATS=nats_server.url)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for example in _examples():
            cmd = example.replace("5760", str(base)).replace("5770", str(base + 10)).replace("9108", "0")
            if cmd.startswith("mavjet gateway"):
                cmd += f" --state-dir {tmp_path / 'state'}"
            if cmd.endswith("&") or cmd.startswith("mavjet gateway"):
                procs.append(subprocess.Popen(_mavjet(cmd), env=env, stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL))
                time.sleep(1.0)
                continue
            if cmd.startswith("mavjet twin"):
                deadline = time.monotonic() + 40
                while True:
                    r = subprocess.run(_mavjet(cmd), env=env, capture_output=True, text=True, timeout=60, check=False)
                    if r.returncode == 0 and "position" in r.stdout and "status" in r.stdout:
                        break
                    assert time.monotonic() < deadline, r.stderr
                    time.sleep(1.0)
                assert "gateway_started" in r.stdout
                continue
            if "--follow" in cmd:
                cmd += " --duration 2s"
            if cmd.strip() == "mavjet fleet":
                cmd += " --duration 2s --no-clear"
            r = subprocess.run(_mavjet(cmd), env=env, capture_output=True, text=True, timeout=60, check=False)
            assert r.returncode == 0, (cmd, r.stderr)
            if cmd.startswith("mavjet fleet"):
                assert "VID-001" in r.stdout and "VID-002" in r.stdout
            if "--follow" in cmd:
                assert "VID-001" in r.stdout
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                assert p.wait(timeout=20) == 0
            except subprocess.TimeoutExpired:
                p.kill()
                pytest.fail("a README process did not stop on SIGTERM")


def test_demo_runs_and_cleans_up(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "mavjet.ops", "demo", "--vehicles", "2", "--speedup", "4", "--duration", "12s",
         "--dir", str(tmp_path / "demo"), "--no-clear"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    frames = r.stdout.split("mavjet fleet")
    last = frames[-1]
    assert "VID-001" in last and "VID-002" in last, r.stdout[-3000:]
    assert " up " in last or "up" in last
    assert "demo stopped" in r.stdout
    # Nothing left running from this demo.
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    assert str(tmp_path / "demo") not in ps


def test_demo_ctrl_c_stops_everything(tmp_path: Path) -> None:
    """Ctrl-C reaches the whole process group: the demo and its children all stop cleanly."""
    out_path = tmp_path / "demo.out"
    with out_path.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mavjet.ops", "demo", "--vehicles", "2", "--speedup", "4",
             "--dir", str(tmp_path / "demo"), "--no-clear"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        # The feed hides successful command results (the operator's own doing); the sortie's
        # commands show as their effect: a `takeoff` event after arm + takeoff through TWIN_CMD.
        while " takeoff " not in out_path.read_text(errors="replace"):
            assert proc.poll() is None, out_path.read_text()[-2000:]
            assert time.monotonic() < deadline, "demo showed no takeoff within 60 s"
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = out_path.read_text(errors="replace")
    assert rc == 0, text[-2000:]
    assert "demo stopped" in text
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    assert str(tmp_path / "demo") not in ps


def test_demo_simulator_retries_a_base_port_taken_before_it_binds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another program takes the picked port between the pick and the bind: the demo picks again."""
    import argparse
    import socket

    from mavjet.ops import demo

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    real_pick = demo.pick_base_port
    picks: list[int] = []

    def pick(n: int, preferred: int = 5760) -> int:
        picks.append(taken.getsockname()[1] if not picks else real_pick(n, preferred=0))
        return picks[-1]

    monkeypatch.setattr(demo, "pick_base_port", pick)
    args = argparse.Namespace(vehicles=1, speedup=4.0, flavour="ardupilot")
    log = tmp_path / "sim.log"
    proc, base = demo._start_sim(args, [sys.executable, "-m", "mavjet.ops"], log, via_commands=True)
    try:
        assert len(picks) == 2 and base == picks[1] != picks[0]
        assert proc.poll() is None and "ready vehicles=1" in log.read_text()
    finally:
        taken.close()
        proc.terminate()
        proc.wait(timeout=10)


def test_readme_completion_commands_run() -> None:
    """The README's completion lines (without their redirections) print a script for that shell."""
    lines = [ln for block in re.findall(r"```sh\n(.*?)```", README, re.S) for ln in block.splitlines()]
    cmds = sorted({m.group(1) for ln in lines if (m := re.search(r"(mavjet completion \w+)", ln))})
    assert cmds == ["mavjet completion bash", "mavjet completion zsh"]
    for cmd in cmds:
        r = subprocess.run(_mavjet(cmd), capture_output=True, text=True, timeout=120, check=False)
        assert r.returncode == 0 and "mavjet" in r.stdout and len(r.stdout) > 1000, (cmd, r.stderr)
