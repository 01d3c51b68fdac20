"""`mavjet gateway` as systemd runs it: READY, periodic WATCHDOG and STOPPING on
an sd_notify socket the test owns, the container health check against its real
metrics endpoint, and the example config as the daemon reads it.
"""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from nats.aio.client import Client

from mavjet.ops.natsserver import NatsServer, free_port

ROOT = Path(__file__).resolve().parents[2]
HEALTHCHECK = ROOT / "deploy" / "container" / "healthcheck.py"


def service_config(tmp_path: Path, nats_url: str, metrics_port: int, vehicle_port: int) -> Path:
    """deploy/gateway.example.toml with this machine's endpoints (and no creds file)."""
    text = (ROOT / "deploy" / "gateway.example.toml").read_text()
    text = text.replace('servers = ["nats://hub-1:4222", "nats://hub-2:4222", "nats://hub-3:4222"]',
                        f'servers = ["{nats_url}"]')
    text = text.replace('creds = "/etc/mavjet/nats.creds"', "")
    text = text.replace('state_dir = "/var/lib/mavjet"', f'state_dir = "{tmp_path / "state"}"')
    text = text.replace("port = 9108", f"port = {metrics_port}")
    text = text.replace("startup_timeout_s = 10", "startup_timeout_s = 2")
    text = text.replace('env = "prod"', 'env = "test"')
    text = text.replace('endpoint = "serial:/dev/ttyAMA0:921600"', f'endpoint = "udp:127.0.0.1:{vehicle_port}"')
    assert f"udp:127.0.0.1:{vehicle_port}" in text and nats_url in text
    cfg = tmp_path / "gateway.toml"
    cfg.write_text(text)
    return cfg


def recv_until(sock: socket.socket, want: bytes, deadline: float, log: list[tuple[float, bytes]]) -> bool:
    while time.monotonic() < deadline:
        sock.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            data = sock.recv(4096)
        except TimeoutError:
            return False
        log.append((time.monotonic(), data))
        if data == want or want in data.split(b"\n"):
            return True
    return False


def test_gateway_notifies_systemd(provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    # A short path: unix socket names are limited to 108 bytes.
    sock_path = str(tmp_path / "n.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    metrics_port = free_port()
    cfg = service_config(tmp_path, nats_server.url, metrics_port, free_port())
    env = {**os.environ, "NOTIFY_SOCKET": sock_path, "WATCHDOG_USEC": "1000000"}
    env.pop("MAVJET_NATS", None)
    env.pop("MAVJET_ENV", None)
    log_file = (tmp_path / "gateway.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "mavjet.ops", "gateway", "--config", str(cfg)],
                            stdout=log_file, stderr=log_file, env=env)
    got: list[tuple[float, bytes]] = []
    try:
        assert recv_until(sock, b"READY=1", time.monotonic() + 45, got), (got, (tmp_path / "gateway.log").read_text())
        ready_at = got[-1][0]
        # Pings every WATCHDOG_USEC/2 = 0.5 s: at least 4 in the next 3 s, none more than 1 s apart.
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            recv_until(sock, b"WATCHDOG=1", deadline, got)
        pings = [t for t, d in got if d == b"WATCHDOG=1" and t >= ready_at]
        assert len(pings) >= 4, got
        gaps = [b - a for a, b in itertools.pairwise(pings)]
        assert max(gaps) < 1.0, gaps  # systemd would kill it at 1.0 s

        # The container health check against the real metrics endpoint.
        hc = subprocess.run([sys.executable, str(HEALTHCHECK), "--url", f"http://127.0.0.1:{metrics_port}/metrics",
                             "--require", "mavjet_nats_connected"],
                            capture_output=True, text=True, timeout=30, check=False)
        assert hc.returncode == 0, hc.stdout

        proc.send_signal(signal.SIGTERM)
        assert recv_until(sock, b"STOPPING=1", time.monotonic() + 20, got), got
        assert proc.wait(timeout=30) == 0
        hc = subprocess.run([sys.executable, str(HEALTHCHECK), "--url", f"http://127.0.0.1:{metrics_port}/metrics",
                             "--timeout", "1"], capture_output=True, text=True, timeout=30, check=False)
        assert hc.returncode == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        log_file.close()
        sock.close()


def test_gateway_without_notify_socket_runs_and_stops(provisioned: Client, nats_server: NatsServer,
                                                      tmp_path: Path) -> None:
    """Outside systemd (no NOTIFY_SOCKET) the same binary runs normally and stops cleanly on SIGTERM."""
    metrics_port = free_port()
    cfg = service_config(tmp_path, nats_server.url, metrics_port, free_port())
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "MAVJET_NATS")}
    log_file = (tmp_path / "gateway.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "mavjet.ops", "gateway", "--config", str(cfg)],
                            stdout=log_file, stderr=log_file, env=env)
    try:
        deadline = time.monotonic() + 45
        ok = False
        while time.monotonic() < deadline and not ok:
            hc = subprocess.run([sys.executable, str(HEALTHCHECK), "--url",
                                 f"http://127.0.0.1:{metrics_port}/metrics", "--timeout", "1"],
                                capture_output=True, text=True, timeout=30, check=False)
            ok = hc.returncode == 0
            if not ok:
                time.sleep(0.2)
        assert ok, (tmp_path / "gateway.log").read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        log_file.close()
