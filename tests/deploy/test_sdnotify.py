"""The sd_notify client against a unix datagram socket the test owns (as systemd would)."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from mavjet.gateway.runtime.sdnotify import Notifier


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5)
    try:
        yield path, sock
    finally:
        sock.close()


def test_absent_socket_is_a_noop() -> None:
    n = Notifier.from_env({})
    assert not n.enabled
    assert n.watchdog_interval_s is None
    assert n.ready() is False and n.watchdog() is False
    assert n.sent == 0 and n.errors == 0


def test_ready_watchdog_status_stopping(notify_socket: tuple[str, socket.socket]) -> None:
    path, sock = notify_socket
    n = Notifier.from_env({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "3000000"})
    assert n.watchdog_interval_s == 1.5
    assert n.ready() and n.watchdog() and n.status("links up\n2 vehicles") and n.stopping()
    got = [sock.recv(4096) for _ in range(4)]
    assert got == [b"READY=1", b"WATCHDOG=1", b"STATUS=links up 2 vehicles", b"STOPPING=1"]
    assert n.sent == 4
    n.close()


def test_abstract_socket() -> None:
    name = f"mavjet-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.settimeout(5)
    try:
        n = Notifier.from_env({"NOTIFY_SOCKET": "@" + name})
        assert n.ready()
        assert sock.recv(64) == b"READY=1"
        n.close()
    finally:
        sock.close()


def test_watchdog_pid_of_another_process_disables_watchdog(notify_socket: tuple[str, socket.socket]) -> None:
    path, _ = notify_socket
    other = Notifier.from_env({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"})
    assert other.watchdog_interval_s is None or os.getpid() == 1
    mine = Notifier.from_env(
        {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}
    )
    assert mine.watchdog_interval_s == 1.0


def test_errors_are_counted_not_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    n = Notifier.from_env({"NOTIFY_SOCKET": str(tmp_path / "nobody-listens.sock")})
    assert n.enabled
    for _ in range(3):
        assert n.watchdog() is False
    assert n.errors == 3 and n.sent == 0
    # Logged once per kind, not once per call: a dead socket must not flood the journal.
    assert len([r for r in caplog.records if "sd_notify" in r.getMessage()]) == 1
    n.close()


def test_full_queue_drops_instead_of_blocking(notify_socket: tuple[str, socket.socket]) -> None:
    path, _ = notify_socket
    n = Notifier.from_env({"NOTIFY_SOCKET": path})
    # Nobody reads: the receive queue fills, and sends then fail fast (EAGAIN) rather than block.
    results = [n.status("x" * 512) for _ in range(5000)]
    assert results[0] is True
    assert results.count(False) == n.errors and n.errors > 0
    n.close()
