"""Configuration errors stop the real `mavjet gateway` process at start: exit 2, one line naming the key.

Nothing is started first (no retry loop, no traceback); an unreachable but
valid server, on the other hand, is retried with backoff and never exits.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mavjet.contract.errors import ConfigError
from mavjet.gateway.resolve import resolve_config
from mavjet.ops.natsserver import free_port

VEHICLE = "VID-001=tcp:127.0.0.1:1"


def gateway_args(tmp_path: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "mavjet.ops", "gateway", "--env", "cfgerr", "--state-dir", str(tmp_path / "state"),
            "--vehicle", VEHICLE, *extra]


def run_gateway(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, check=False, capture_output=True, text=True, timeout=60)


def _port_in_use(tmp_path: Path, hold: list[socket.socket]) -> list[str]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    hold.append(s)
    return ["--metrics-port", str(s.getsockname()[1])]


def _not_writable_state_dir(tmp_path: Path, hold: list[socket.socket]) -> list[str]:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    return ["--state-dir", str(blocker / "state")]  # below a regular file: fails even for root


def _write(path: Path, text: str) -> list[str]:
    path.write_text(text)
    return ["--tls-ca", str(path)]


CASES: dict[str, tuple[Callable[[Path, list[socket.socket]], list[str]], str]] = {
    "metrics port in use": (_port_in_use, "metrics.port"),
    "tls ca missing": (lambda p, _: ["--tls-ca", str(p / "missing-ca.pem")], "nats.tls_ca"),
    "tls ca not PEM": (lambda p, _: _write(p / "ca.pem", "not a certificate"), "nats.tls"),
    "state dir not writable": (_not_writable_state_dir, "state_dir"),
    "invalid nats url (port)": (lambda p, _: ["--nats", "nats://127.0.0.1:notaport"], "--nats"),
    "invalid nats url (scheme)": (lambda p, _: ["--nats", "http://127.0.0.1:4222"], "--nats"),
    "invalid nats url (no host)": (lambda p, _: ["--nats", "nats://:4222"], "--nats"),
    "creds file missing": (lambda p, _: ["--creds", str(p / "missing.creds")], "nats.creds"),
    "same vid twice": (lambda p, _: ["--vehicle", "VID-001=tcp:127.0.0.1:2"], "--vehicle"),
    "workers out of range": (lambda p, _: ["--workers", "0"], "workers"),
    "track rate not a number": (lambda p, _: ["--track-hz", "nan"], "track_hz"),
    "uplink probe interval nan": (lambda p, _: _config(p, "[uplink]\nprobe_interval_s = nan\n"),
                                  "uplink.probe_interval_s"),
    "uplink value not a number": (lambda p, _: _config(p, '[uplink]\ntarget_delay_s = "x"\n'),
                                  "uplink.target_delay_s"),
}


def _config(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "gateway.toml"
    path.write_text(text)
    return ["--config", str(path)]



@pytest.mark.parametrize("case", list(CASES))
def test_config_error_exits_2_with_one_line(case: str, tmp_path: Path) -> None:
    make, key = CASES[case]
    hold: list[socket.socket] = []
    try:
        t0 = time.monotonic()
        out = run_gateway(gateway_args(tmp_path, *make(tmp_path, hold)))
        took_s = time.monotonic() - t0
    finally:
        for s in hold:
            s.close()
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, out.stderr[-2000:]
    assert len(lines) == 1, out.stderr[-2000:]
    assert lines[0].startswith(f"mavjet gateway: config {key}: "), lines[0]
    assert out.stdout == ""
    assert took_s < 30  # failed at start, not after a retry loop


def test_unreachable_valid_url_keeps_retrying(tmp_path: Path) -> None:
    log_path = tmp_path / "gateway.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(gateway_args(tmp_path, "--nats", f"nats://127.0.0.1:{free_port()}", "--log-json"),
                                stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while "nats_unreachable" not in log_path.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log_path.read_text()[-2000:]
            time.sleep(0.2)
        time.sleep(2)
        assert proc.poll() is None, log_path.read_text()[-2000:]  # still retrying
        assert "nats_unreachable" in log_path.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log_path.read_text()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_same_vid_twice_on_the_command_line_is_an_error() -> None:
    with pytest.raises(ConfigError) as exc:
        resolve_config({}, flags={"vehicle": [VEHICLE, "VID-001=tcp:127.0.0.1:2"]}, environ={})
    assert exc.value.key == "--vehicle" and "VID-001" in exc.value.reason
    # The command line still replaces the file's entry with the same vid.
    raw = {"vehicles": [{"vid": "VID-001", "endpoint": "tcp:127.0.0.1:9"}]}
    cfg = resolve_config(raw, flags={"vehicle": [VEHICLE]}, environ={})
    assert [str(v.endpoint) for v in cfg.vehicles] == ["tcp:127.0.0.1:1"]


def test_uvloop_configured_but_not_installed_is_a_config_error(tmp_path: Path) -> None:
    """The real process, with uvloop hidden from it: exit 2 and one line, not an ImportError traceback."""
    code = ("import sys; sys.modules['uvloop'] = None; "  # what `import uvloop` sees without the package
            "from mavjet.ops.cli import main; sys.exit(main())")
    args = gateway_args(tmp_path, "--uvloop")
    res = run_gateway([sys.executable, "-c", code, *args[3:]])
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "uvloop" in lines[0] and "not installed" in lines[0], res.stderr
