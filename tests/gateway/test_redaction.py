"""Secrets never printed: URL passwords and tokens, creds contents, nkey seeds.

Unit tests of the one redaction function and the structlog processor, then
the real `mavjet gateway` process with a password in `--nats`, against an
unreachable server and against a real nats-server that requires that password.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from mavjet.contract.errors import ConfigError
from mavjet.contract.natsconn import NatsOptions, NatsUnavailable
from mavjet.contract.redact import redact, redact_event
from mavjet.gateway.runtime import logs
from mavjet.ops.natsserver import NatsServer, free_port, wait_port
from mavjet.ops.runner import run_cli

PASSWORD = "s3cretPW-9f2c"
TOKEN = "tok3n-77ab"
SEED = "SUAIBDPBAUTWCWBKIO6XHQNINK5FWJW4OHLXC3HQ2KFE4PEJUA44CNHTC4"
JWT = "eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.eyJqdGkiOiJBQkNERUZHSCJ9.c2lnbmF0dXJlLXNpZw"
CREDS = f"""-----BEGIN NATS USER JWT-----
{JWT}
------END NATS USER JWT------

************************* IMPORTANT *************************
NKEY Seed printed below can be used to sign and prove identity.

-----BEGIN USER NKEY SEED-----
{SEED}
------END USER NKEY SEED------
"""
SECRETS = (PASSWORD, TOKEN, SEED, JWT)


@pytest.mark.parametrize(("text", "shown"), [
    (f"nats://alice:{PASSWORD}@hub:4222", "nats://alice:***@hub:4222"),
    (f"tls://{TOKEN}@hub:4222", "tls://***@hub:4222"),
    (f"nats://hub:4222?token={TOKEN}&x=1", "nats://hub:4222?token=***&x=1"),
    (f"alice:{PASSWORD}@127.0.0.1:4222", "alice:***@127.0.0.1:4222"),  # a parsed URL's netloc
    (f"seed {SEED} here", "seed *** here"),
    (f"jwt={JWT}", "jwt=***"),
    ("nats://127.0.0.1:4222, ws://[::1]:80 at 12:30:01", "nats://127.0.0.1:4222, ws://[::1]:80 at 12:30:01"),
])
def test_redact(text: str, shown: str) -> None:
    assert redact(text) == shown


def test_creds_file_contents_are_redacted() -> None:
    out = redact(CREDS)
    assert not any(s in out for s in SECRETS)
    assert "BEGIN NATS USER JWT" in out  # what it was stays readable


def test_structlog_processor_redacts_every_value_and_exceptions() -> None:
    event = {
        "event": "nats_unreachable",
        "servers": [f"nats://alice:{PASSWORD}@a:4222", f"nats://{TOKEN}@b:4222"],
        "nested": {"url": f"nats://x:4222?token={TOKEN}", "n": 3},
        "error": ValueError(f"bad seed {SEED}"),
    }
    out = redact_event(None, "warning", dict(event))
    text = json.dumps(out)
    assert not any(s in text for s in SECRETS), text
    assert out["nested"]["n"] == 3 and "alice:***@a:4222" in text


def test_configured_logger_redacts_fields_and_tracebacks(monkeypatch: pytest.MonkeyPatch) -> None:
    buf = io.StringIO()
    monkeypatch.setattr(sys, "stderr", buf)
    logs.configure("info", json=True)
    try:
        log = structlog.get_logger("test")
        log.warning("nats_unreachable", servers=[f"nats://alice:{PASSWORD}@hub:4222"])
        try:
            raise RuntimeError(f"cannot use nats://alice:{PASSWORD}@hub:4222 with {SEED}")
        except RuntimeError:
            log.exception("boom")
    finally:
        structlog.reset_defaults()
    text = buf.getvalue()
    assert "alice:***@hub:4222" in text and "RuntimeError" in text
    assert not any(s in text for s in SECRETS), text


def test_error_messages_are_redacted() -> None:
    exc = NatsUnavailable((f"nats://alice:{PASSWORD}@hub:4222",), f"refused by nats://{TOKEN}@hub:4222")
    assert PASSWORD not in str(exc) and TOKEN not in str(exc) and TOKEN not in exc.reason
    with pytest.raises(ConfigError) as bad:
        NatsOptions(servers=(f"nats://alice:{PASSWORD}@hub:port",))
    assert PASSWORD not in str(bad.value) and "alice:***@hub" in str(bad.value)


def test_help_shows_no_secret_from_the_environment() -> None:
    env = dict(os.environ, MAVJET_NATS=f"nats://alice:{PASSWORD}@hub:4222")
    for cmd in (["gateway"], ["events"], ["fleet"]):
        out = subprocess.run([sys.executable, "-m", "mavjet.ops", *cmd, "--help"], check=False, env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert PASSWORD not in out.stdout + out.stderr


def _run_gateway(tmp_path: Path, nats_url: str, *, seconds: float, until: str | None = None) -> str:
    """Run the real gateway process, stop it with SIGTERM after `seconds` (or once `until` is logged)."""
    log_path = tmp_path / "gateway.log"
    args = [sys.executable, "-m", "mavjet.ops", "gateway", "--nats", nats_url, "--env", "redact",
            "--state-dir", str(tmp_path / "state"), "--vehicle", "VID-001=tcp:127.0.0.1:1",
            "--log-level", "debug", "--log-json", "--no-commands", "--no-shadow"]
    with log_path.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if until is not None and until in log_path.read_text():
                break
            assert proc.poll() is None, log_path.read_text()[-2000:]  # a valid URL never exits
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return log_path.read_text()


def test_gateway_process_never_prints_the_password_when_unreachable(tmp_path: Path) -> None:
    port = free_port()
    text = _run_gateway(tmp_path, f"nats://alice:{PASSWORD}@127.0.0.1:{port},nats://{TOKEN}@127.0.0.1:{port}",
                        seconds=8, until="nats_unreachable")
    assert "nats_unreachable" in text and "alice:***@127.0.0.1" in text, text[-2000:]
    assert PASSWORD not in text and TOKEN not in text, text[-2000:]


@pytest.fixture
def password_server(tmp_path: Path) -> Iterator[NatsServer]:
    srv = NatsServer(store_dir=str(tmp_path / "js"), log_file=str(tmp_path / "nats.log"),
                     extra_args=["--user", "alice", "--pass", PASSWORD])
    srv.start()
    assert wait_port(srv.host, srv.port, 10)
    try:
        yield srv
    finally:
        srv.cleanup()


def test_gateway_process_never_prints_the_password_when_connected(
    tmp_path: Path, password_server: NatsServer
) -> None:
    url = f"nats://alice:{PASSWORD}@{password_server.host}:{password_server.port}"
    text = _run_gateway(tmp_path, url, seconds=20, until="nats_connected")
    assert "nats_connected" in text, text[-2000:]
    assert PASSWORD not in text, text[-2000:]


def test_operator_command_error_line_is_redacted(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="mavjet twin")

    def run(_: argparse.Namespace) -> int:
        raise NatsUnavailable((f"nats://alice:{PASSWORD}@hub:4222",), f"ConnectionRefusedError at {TOKEN}@hub")

    assert run_cli(parser, run, []) == 2
    err = capsys.readouterr().err
    assert err.startswith("mavjet twin: cannot reach NATS at nats://alice:***@hub:4222") and PASSWORD not in err
