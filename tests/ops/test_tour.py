"""The operator's first hour, scripted: the README's commands with good and bad input.

Against a real nats-server, simulated vehicles and real gateway processes:
VID-001 and VID-002 are served (VID-001 with `tunnel = true`), VID-003's
gateway is stopped once it has registered the vehicle (a vehicle whose
gateway is gone: `mavjet fleet` shows it stale), VID-999 was never seen and
env `never` was never provisioned. Every run is checked for what the issue
asked: no traceback anywhere, errors in one line, the exit codes of
docs/operations.md, and nothing reported stored that was not.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import pytest

from mavjet.ops.demo import pick_base_port
from mavjet.ops.natsserver import NatsServer, free_port

pytestmark = pytest.mark.waits  # its time goes to child processes: a simulator, two gateways, ~60 CLI runs

ENV = "tour"
ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "sim" / "plans" / "demo.plan"
MAVJET = [sys.executable, "-m", "mavjet.ops"]
NOISE = ("Traceback", "never retrieved", "Task was destroyed", "Unclosed", "RuntimeWarning")


@dataclass
class Tour:
    url: str
    env: dict[str, str]
    tmp: Path

    def run(self, *argv: str, rc: int | tuple[int, ...] = 0, within_s: float = 30.0,
            extra_env: dict[str, str] | None = None, one_line: bool = True) -> subprocess.CompletedProcess[str]:
        """Run `mavjet ARGV` (env and URL from MAVJET_ENV/MAVJET_NATS); check the exit code and the output's form."""
        t0 = time.monotonic()
        r = subprocess.run([*MAVJET, *argv], capture_output=True, text=True, timeout=within_s + 30, check=False,
                           env={**self.env, **(extra_env or {})})
        took = time.monotonic() - t0
        said = f"mavjet {' '.join(argv)} -> {r.returncode} in {took:.1f} s\nstdout: {r.stdout[-1500:]}\nstderr: {r.stderr[-1500:]}"
        for noise in NOISE:
            assert noise not in r.stdout + r.stderr, said
        assert r.returncode in ((rc,) if isinstance(rc, int) else rc), said
        if r.returncode == 2 and one_line:  # an error: one line on stderr, naming the command
            lines = r.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("mavjet "), said
        assert took < within_s, said
        return r


def _wait(pred: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s"
        time.sleep(0.3)


def _fleet(tour: Tour) -> dict[str, dict[str, object]]:
    doc = json.loads(tour.run("fleet", "--once", "--json").stdout)
    return {str(v["vid"]): v for v in doc["vehicles"]}


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def test_the_operators_first_hour(nats_server: NatsServer, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAVJET_")}
    # host:port without a scheme, as the nats CLI takes it.
    tour = Tour(url=nats_server.url, env={**env, "MAVJET_NATS": f"127.0.0.1:{nats_server.port}", "MAVJET_ENV": ENV},
                tmp=tmp_path)
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[BinaryIO] = []
    try:
        # -- before anything exists: the env is not provisioned ------------------------------------
        for argv in (("twin", "VID-001"), ("events",), ("events", "--vid", "VID-001"), ("fleet", "--once"),
                     ("cmd", "VID-001", "arm"), ("shadow", "get", "VID-001"), ("logs", "ls", "VID-001"),
                     ("tunnel", "VID-001"), ("mission", "ls")):
            r = tour.run(*argv, rc=2, within_s=10)
            assert f"mavjet provision --env {ENV}" in r.stderr or "provision" in r.stderr, r.stderr
        tour.run("provision", "--size", "small", "--dry-run")
        tour.run("provision", "--size", "small")

        # -- the fleet: three sim vehicles, a gateway for two (tunnel on VID-001), one for VID-003 --
        base = pick_base_port(3, preferred=0)
        log = (tmp_path / "sim.log").open("wb")
        logs.append(log)
        procs.append(subprocess.Popen([*MAVJET, "sim", "--vehicles", "3", "--base-port", str(base)], env=tour.env,
                                      stdout=log, stderr=subprocess.STDOUT))
        config = tmp_path / "gateway.toml"
        config.write_text(
            f'[[vehicles]]\nvid = "VID-001"\nendpoint = "tcp:127.0.0.1:{base}"\ntunnel = true\n'
            f'[[vehicles]]\nvid = "VID-002"\nendpoint = "tcp:127.0.0.1:{base + 10}"\n')
        _wait(lambda: b"ready vehicles=" in (tmp_path / "sim.log").read_bytes(), 30, "simulator")
        for name, argv in (("gw", ["--config", str(config)]),
                           ("gw3", ["--vehicle", f"VID-003=tcp:127.0.0.1:{base + 20}", "--instance", "gw3"])):
            out = (tmp_path / f"{name}.log").open("wb")
            logs.append(out)
            procs.append(subprocess.Popen(
                [*MAVJET, "gateway", *argv, "--nats", nats_server.url, "--env", ENV, "--state-dir", str(tmp_path / name),
                 "--metrics-port", "0"],
                env=tour.env, stdout=out, stderr=subprocess.STDOUT))
        gw3 = procs[-1]
        # served: each has its gateway's liveness record (a fresh row), not only samples
        _wait(lambda: [v for v, row in _fleet(tour).items() if not row["stale"]] == ["VID-001", "VID-002", "VID-003"],
              40, "three live vehicles in the fleet")
        _stop(gw3)  # VID-003's gateway is gone from now on; the fleet shows it stale ~5 s later
        gone_at = time.monotonic()

        # -- the README's read commands, good input ---------------------------------------------------
        r = tour.run("twin", "VID-001")
        assert r.stdout.startswith("VID-001 (tour)") and "position" in r.stdout
        r = tour.run("events", "--vid", "VID-001", "--json")
        assert {json.loads(line)["vid"] for line in r.stdout.splitlines()} == {"VID-001"}
        _wait(lambda: "home_lat_deg" in tour.run("events", "--type", "home_set").stdout, 20, "home_set event")
        r = tour.run("events", "--type", "home_set")
        assert "home_lat_deg=-35.36" in r.stdout and len(r.stdout.split("home_lat_deg=")[1].split()[0]) >= 11  # 7 decimals
        r = tour.run("fleet", "--once")
        assert f"export MAVJET_NATS=nats://127.0.0.1:{nats_server.port}" in r.stdout
        tour.run("events", "--follow", "--vid", "VID-001", "--duration", "1s")
        tour.run("fleet", "--duration", "1s", "--no-clear")
        tour.run("cmd", "--list", "json")
        r = tour.run("cmd", "VID-001", "param_get", "-p", "name=RTL_ALT", "--wait", "--timeout", "20s")
        assert "accepted" in r.stdout
        r = tour.run("shadow", "set", "VID-002", "params.RTL_ALT=2000")
        revision = r.stdout.split()[-1]
        doc = json.loads(tour.run("shadow", "get", "VID-002", "--desired", "--json").stdout)
        assert str(doc["desired"]["revision"]) == revision and doc["desired"]["value"]["params"]["RTL_ALT"] == 2000
        tour.run("shadow", "history", "VID-002")
        tour.run("shadow", "diff", "VID-002", rc=(0, 1))
        # The plan checks may refuse (a line per finding): then nothing is stored.
        r = tour.run("mission", "put", str(PLAN), rc=(0, 2), one_line=False)
        listed = tour.run("mission", "ls", "--json").stdout
        assert ("missions/demo.plan" in listed) == (r.returncode == 0), (r.stderr, listed)
        blob = tmp_path / "artifact.bin"
        blob.write_bytes(os.urandom(200_000))
        r = tour.run("blobs", "put", str(blob), "--name", "logs/VID-001/artifact.bin")
        assert "sent" in r.stdout and "100%" in r.stderr
        r = tour.run("blobs", "put", str(blob), "--name", "logs/VID-001/again.bin")
        assert "already stored" in r.stdout and "%" not in r.stderr  # checked first: no progress for nothing sent
        assert "logs/VID-001/again.bin" in tour.run("blobs", "ls", "logs/").stdout
        tour.run("blobs", "get", "logs/VID-001/again.bin", "-o", str(tmp_path / "back.bin"))
        assert (tmp_path / "back.bin").read_bytes() == blob.read_bytes()
        r = tour.run("logs", "ls", "VID-001", within_s=30)
        assert r.stdout.splitlines()[0].split()[:2] == ["LOG", "SIZE"]  # a header, piped too
        tour.run("logs", "ls", "VID-001", "--stored")
        tour.run("monitor", "--once", rc=(0, 1))

        # -- the tunnel: served for VID-001, refused at once for VID-002 (no `tunnel = true`) ---------
        tunnel = subprocess.Popen([*MAVJET, "tunnel", "VID-001", "--listen", f"udp:127.0.0.1:{free_port()}"], env=tour.env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        procs.append(tunnel)
        assert tunnel.stdout is not None
        assert b"VID-001 <->" in tunnel.stdout.readline()
        tunnel.send_signal(signal.SIGINT)
        _out, err = tunnel.communicate(timeout=10)
        assert tunnel.returncode == 130 and b"Traceback" not in err
        r = tour.run("tunnel", "VID-002", rc=2, within_s=5)
        assert "tunnel = true" in r.stderr

        # -- an unknown vehicle: one line, exit 2, --force where queuing makes sense -----------------
        for argv in (("twin", "VID-999"), ("events", "--vid", "VID-999"), ("shadow", "get", "VID-999"),
                     ("shadow", "diff", "VID-999"), ("logs", "ls", "VID-999"), ("logs", "get", "VID-999", "latest"),
                     ("tunnel", "VID-999")):
            r = tour.run(*argv, rc=2, within_s=5)
            assert "VID-999" in r.stderr and "mavjet fleet" in r.stderr
        for argv in (("cmd", "VID-999", "arm"), ("shadow", "set", "VID-999", "mode=GUIDED")):
            r = tour.run(*argv, rc=2, within_s=5)
            assert "--force" in r.stderr
        assert "VID-999" not in json.dumps(_fleet(tour))  # nothing was stored for it

        # -- a vehicle whose gateway is gone: refused, or queued with its deadline ------------------------
        time.sleep(max(0.0, 6.0 - (time.monotonic() - gone_at)))
        deadline = time.monotonic() + 20
        while (row := _fleet(tour)["VID-003"])["stale_reason"] != "gateway gone":
            assert time.monotonic() < deadline, f"VID-003 not stale with its gateway gone: {row}"
            time.sleep(0.5)
        r = tour.run("cmd", "VID-003", "arm", rc=2, within_s=5)
        assert "gateway is gone" in r.stderr and "--force" in r.stderr
        r = tour.run("cmd", "VID-003", "arm", "--force", "--deadline", "5s", "--id", "for-a-gone-vehicle")
        assert r.stdout.strip() == "for-a-gone-vehicle" and "deadline" in r.stderr and "warning" in r.stderr
        r = tour.run("shadow", "set", "VID-003", "mode=LOITER")
        assert "gateway is gone" in r.stderr
        assert json.loads(tour.run("shadow", "get", "VID-003", "--desired").stdout) == {"mode": "LOITER"}
        for argv in (("logs", "ls", "VID-003"), ("tunnel", "VID-003")):
            r = tour.run(*argv, rc=2, within_s=5)
            assert "gateway is gone" in r.stderr
        assert "STALE: gateway gone" in tour.run("twin", "VID-003").stdout
        tour.run("events", "--vid", "VID-003")

        # -- the wrong server: refused at once, a bad flag named as the flag ---------------------------
        refused = {"MAVJET_NATS": "127.0.0.1:1"}
        for argv in (("twin", "VID-001"), ("events",), ("fleet", "--once"), ("shadow", "get", "VID-001"),
                     ("logs", "ls", "VID-001"), ("tunnel", "VID-001"), ("mission", "ls"), ("blobs", "ls"),
                     ("blobs", "put", str(blob))):
            r = tour.run(*argv, rc=2, within_s=2, extra_env=refused)
            assert "connection refused" in r.stderr
        tour.run("cmd", "VID-001", "arm", rc=3, within_s=2, extra_env=refused)
        r = tour.run("events", "--nats", "http://127.0.0.1:4222", rc=2, within_s=5)
        assert r.stderr.startswith("mavjet events: --nats") and "config" not in r.stderr
        # replay prints its stages on stderr; the error is its last line
        r = tour.run("replay", "--since", "1h", "--out", str(tmp_path / "report"), "--nats", "nats://127.0.0.1:1",
                     rc=2, within_s=20, one_line=False)
        assert r.stderr.strip().splitlines()[-1].startswith("mavjet replay: ") and not (tmp_path / "report").exists()

        # -- an env that was never provisioned (on a provisioned server) -------------------------------
        never = {"MAVJET_ENV": "never"}
        for argv in (("twin", "VID-001"), ("events",), ("events", "--vid", "VID-001"), ("fleet", "--once"),
                     ("cmd", "VID-001", "arm"), ("shadow", "set", "VID-001", "mode=GUIDED"), ("logs", "ls", "VID-001"),
                     ("tunnel", "VID-001"), ("synth", "--vehicles", "1", "--days", "1", "--track-hz", "0")):
            r = tour.run(*argv, rc=2, within_s=10, extra_env=never)
            assert "mavjet provision --env never" in r.stderr
        # the synthetic history counts what the stream acknowledged
        r = tour.run("synth", "--vehicles", "1", "--days", "1", "--track-hz", "0", "--max-events", "40")
        summary = json.loads(r.stdout)
        assert 0 < summary["published"] == summary["events"] and summary["duplicates"] == 0
        stored = tour.run("events", "--vid", "VID-0001", "--since", "3d", "--json").stdout.splitlines()
        assert len(stored) == summary["published"]

        # -- pipes and signals: a closed stdout ends a command at once, Ctrl-C is 130 -------------------
        for argv in (("events", "--follow"), ("fleet",), ("events",)):
            p = subprocess.Popen([*MAVJET, *argv], env=tour.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            assert p.stdout is not None and p.stdout.readline()
            p.stdout.close()
            assert p.wait(timeout=30) == 0, argv  # at once when idle; 30 s is room for a loaded CI host
            assert p.stderr is not None and b"Traceback" not in p.stderr.read()
            p.stderr.close()
        p = subprocess.Popen([*MAVJET, "events", "--follow"], env=tour.env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        assert p.stdout is not None and p.stdout.readline()
        p.send_signal(signal.SIGINT)
        _out, err = p.communicate(timeout=30)
        assert p.returncode == 130 and b"Traceback" not in err
    finally:
        for proc in reversed(procs):
            _stop(proc)
        for f in logs:
            f.close()
