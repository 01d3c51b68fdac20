"""The embedded nats-server's Go runtime: GOMAXPROCS as given, the environment's own value first.

Read back from the real server's /varz (`gomaxprocs`, what its Go runtime runs with).
"""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

import pytest

from mavjet.ops.natsserver import COLOCATED_GOMAXPROCS, NatsServer, NatsServerError, free_port


def _varz_gomaxprocs(tmp_path: Path, gomaxprocs: int | None = None) -> int:
    monitor = free_port()
    srv = NatsServer(store_dir=str(tmp_path / "js"), extra_args=["-m", str(monitor)], gomaxprocs=gomaxprocs)
    with srv, urllib.request.urlopen(f"http://127.0.0.1:{monitor}/varz", timeout=5) as resp:
        varz = json.load(resp)
    return int(varz["gomaxprocs"])


def test_gomaxprocs_reaches_the_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GOMAXPROCS", raising=False)
    assert COLOCATED_GOMAXPROCS == 1
    assert _varz_gomaxprocs(tmp_path / "a", gomaxprocs=COLOCATED_GOMAXPROCS) == 1
    assert NatsServer(gomaxprocs=1).go_max_procs == "1"


def test_default_is_gos_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GOMAXPROCS", raising=False)
    srv = NatsServer()
    assert "GOMAXPROCS" not in srv.environment()
    assert srv.go_max_procs == "default"
    # Go's default: one thread per usable core (or fewer, under a cgroup CPU limit).
    assert 1 <= _varz_gomaxprocs(tmp_path) <= len(os.sched_getaffinity(0))


def test_the_environment_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOMAXPROCS", "3")
    srv = NatsServer(gomaxprocs=1)
    assert srv.environment()["GOMAXPROCS"] == "3"
    assert srv.go_max_procs == "3"
    assert _varz_gomaxprocs(tmp_path, gomaxprocs=1) == 3


def test_zero_is_refused_when_the_server_is_described() -> None:
    with pytest.raises(NatsServerError, match="gomaxprocs must be at least 1, got 0"):
        NatsServer(gomaxprocs=0)
    srv = NatsServer(gomaxprocs=1)
    srv.gomaxprocs = -2  # set later: refused before a process is started with it
    with pytest.raises(NatsServerError, match="got -2"):
        srv.start()
    assert srv.proc is None


def test_the_report_is_what_the_process_was_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GOMAXPROCS", raising=False)
    srv = NatsServer(store_dir=str(tmp_path / "js"), gomaxprocs=1).start()
    try:
        monkeypatch.setenv("GOMAXPROCS", "3")  # after the start: the running server still has 1
        assert srv.go_max_procs == "1"
        assert NatsServer(gomaxprocs=1).go_max_procs == "3"  # one not yet started would get 3
    finally:
        srv.stop()
