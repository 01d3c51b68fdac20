"""A TLS failure says which certificate check failed, not a bare TimeoutError.

A throwaway CA and server certificate (openssl CLI), a real nats-server with
TLS on loopback, and the real `mavjet` processes: an operator command with
the wrong CA gets one line naming the check; the gateway, which retries a
valid server, logs the same reason in its `nats_unreachable` line.
"""

from __future__ import annotations

import json
import shutil
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mavjet.contract.natsconn import describe_error
from mavjet.ops.natsserver import NatsServer, wait_port

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@dataclass(frozen=True, kw_only=True)
class Pki:
    ca: Path  # signed the server certificates
    other_ca: Path  # signed nothing here
    server_cert: Path  # for 127.0.0.1 and localhost
    server_key: Path
    wrong_host_cert: Path  # signed by `ca`, for another host only
    wrong_host_key: Path


def _ca(d: Path, name: str) -> Path:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem",
             "-days", "2", "-subj", f"/CN={name}", cwd=d)
    return d / f"{name}.pem"


def _server(d: Path, name: str, san: str) -> tuple[Path, Path]:
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", f"/CN={name}", cwd=d)
    (d / f"{name}.ext").write_text(f"subjectAltName={san}\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)
    return d / f"{name}.pem", d / f"{name}.key"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca = _ca(d, "ca")
    other = _ca(d, "other-ca")
    cert, key = _server(d, "server", "IP:127.0.0.1,DNS:localhost")
    wcert, wkey = _server(d, "elsewhere", "DNS:elsewhere.example")
    return Pki(ca=ca, other_ca=other, server_cert=cert, server_key=key, wrong_host_cert=wcert, wrong_host_key=wkey)


def _tls_server(tmp_path: Path, cert: Path, key: Path) -> Iterator[NatsServer]:
    srv = NatsServer(store_dir=str(tmp_path / "js"), log_file=str(tmp_path / "nats.log"),
                     extra_args=["--tlscert", str(cert), "--tlskey", str(key)])
    srv.start()
    assert wait_port(srv.host, srv.port, 10)
    try:
        yield srv
    finally:
        srv.cleanup()


@pytest.fixture
def tls_server(tmp_path: Path, pki: Pki) -> Iterator[NatsServer]:
    yield from _tls_server(tmp_path, pki.server_cert, pki.server_key)


@pytest.fixture
def wrong_host_server(tmp_path: Path, pki: Pki) -> Iterator[NatsServer]:
    yield from _tls_server(tmp_path, pki.wrong_host_cert, pki.wrong_host_key)


def _operator(url: str, ca: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mavjet.ops", "events", "--nats", url, "--tls-ca", str(ca)],
                          check=False, capture_output=True, text=True, timeout=60)


def test_wrong_ca_names_the_failed_check(tls_server: NatsServer, pki: Pki) -> None:
    out = _operator(tls_server.url, pki.other_ca)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
    assert "TLS certificate verify failed" in lines[0] and "unknown CA" in lines[0], lines[0]
    assert "TimeoutError" not in lines[0]


def test_hostname_mismatch_names_the_failed_check(wrong_host_server: NatsServer, pki: Pki) -> None:
    out = _operator(wrong_host_server.url, pki.ca)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
    assert "TLS certificate verify failed" in lines[0] and "mismatch" in lines[0], lines[0]


def test_the_right_ca_connects(tls_server: NatsServer, pki: Pki) -> None:
    """The control: the same server and CA files work when they match (no JetStream here: the TLS part is what counts)."""
    out = _operator(f"nats://localhost:{tls_server.port}", pki.ca)
    assert "TLS" not in out.stderr and "cannot reach NATS" not in out.stderr, out.stderr[-2000:]


def test_gateway_logs_the_failed_check_and_keeps_retrying(tmp_path: Path, tls_server: NatsServer, pki: Pki) -> None:
    log_path = tmp_path / "gateway.log"
    args = [sys.executable, "-m", "mavjet.ops", "gateway", "--nats", tls_server.url, "--tls-ca", str(pki.other_ca),
            "--env", "tls", "--state-dir", str(tmp_path / "state"), "--vehicle", "VID-001=tcp:127.0.0.1:1",
            "--log-json", "--no-commands", "--no-shadow"]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while "nats_unreachable" not in log_path.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log_path.read_text()[-2000:]
            time.sleep(0.2)
        assert proc.poll() is None  # a valid server that may get the right certificate later: keep retrying
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    unreachable = [e for e in lines if e.get("event") == "nats_unreachable"]
    assert unreachable, log_path.read_text()[-2000:]
    assert "TLS certificate verify failed" in unreachable[0]["error"] and "unknown CA" in unreachable[0]["error"]


@pytest.mark.parametrize(("code", "message", "named"), [
    (10, "certificate has expired", "expired"),
    (18, "self-signed certificate", "self-signed"),
    (19, "self-signed certificate in certificate chain", "self-signed CA"),
    (20, "unable to get local issuer certificate", "unknown CA"),
    (62, "Hostname mismatch, certificate is not valid for 'hub'", "hostname mismatch"),
])
def test_each_verify_failure_is_named(code: int, message: str, named: str) -> None:
    """The checks a loopback test cannot stage (expired needs a clock in the past) are named too."""
    exc = ssl.SSLCertVerificationError(1, f"[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: {message}")
    exc.verify_code = code
    exc.verify_message = message
    line = describe_error(exc)
    assert line.startswith(f"TLS certificate verify failed: {message} (") and named in line, line
