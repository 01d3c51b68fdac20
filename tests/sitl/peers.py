"""The vehicles a scenario runs against: the simulator (`sim/`) always, a real ArduCopter SITL when one is at hand.

A peer's `start` is an async context manager that yields a `Site`: the MAVLink
endpoints (SERIAL0) of `n` fresh vehicles, and more ports of each on demand. The SITL peer starts `n` instances of the binary named by
ARDUCOPTER_BIN through the `run-copter` script of the shared SITL kit that
sits beside the repository (fresh eeprom, no dataflash logs), each in its own
working dir under the test's tmp dir, and stops them with SIGTERM.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import anyio
import anyio.to_thread

from mavjet.sim.fleet import SimConfig, SimFleet

# The SITL kit lives beside the repository, never inside it.
RUN_COPTER = Path(__file__).parents[2].parent / "shared" / "sitl" / "run-copter"
BIN_ENV = "ARDUCOPTER_BIN"
SPEEDUP = float(os.environ.get("SITL_SPEEDUP", "5"))
# Instance numbers (TCP 5760 + 10 N) far from the kit's default 0..2, so a developer's own SITL is left alone.
FIRST_INSTANCE = int(os.environ.get("SITL_FIRST_INSTANCE", "40"))


def sitl_missing() -> str | None:
    """Why the SITL peer cannot run here, or None."""
    if not os.environ.get(BIN_ENV):
        return (f"SITL tier skipped: set {BIN_ENV} to an ArduCopter SITL binary built from upstream ArduPilot "
                "(no binary ships with mavjet)")
    if not Path(os.environ[BIN_ENV]).is_file():
        return f"SITL tier skipped: {BIN_ENV}={os.environ[BIN_ENV]} is not a file"
    if not RUN_COPTER.is_file():
        return f"SITL tier skipped: no run-copter script at {RUN_COPTER}"
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Site:
    """The vehicles of one scenario: `endpoints[k]` is vehicle k's SERIAL0."""

    endpoints: list[str]
    # serial(k, link_id): the endpoint of vehicle k's SERIAL<link_id> (a single client each, as on SITL).
    serial: Callable[[int, int], Awaitable[str]]
    # log_file(k, log_id): the bytes of vehicle k's dataflash log as the vehicle holds it (None if absent).
    log_file: Callable[[int, int], bytes | None]


class Start(Protocol):
    def __call__(self, n: int, tmp: Path, *, logs: bool = False) -> AbstractAsyncContextManager[Site]: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Peer:
    name: str  # "sim" or "sitl"
    # `logs`: the vehicles keep dataflash logs (SITL runs with LOG_BACKEND_TYPE 0 otherwise: ~3 MB a minute).
    start: Start
    # Wall seconds for the autopilot to become armable after its start (SITL: EKF on GPS after ~40 s of its time).
    armable_within_s: float


@asynccontextmanager
async def sim_vehicles(n: int, tmp: Path, *, logs: bool = False) -> AsyncIterator[Site]:
    async with SimFleet(SimConfig(vehicles=n, base_port=0, speedup=SPEEDUP)) as fleet:

        async def serial(k: int, link_id: int) -> str:
            return await fleet.vehicles[k].listen_serial(link_id)

        def log_file(k: int, log_id: int) -> bytes | None:  # the sim always holds its two logs
            return next((lg.data for lg in fleet.vehicles[k].logs.logs if lg.log_id == log_id), None)

        yield Site(endpoints=list(fleet.endpoints), serial=serial, log_file=log_file)


def _spawn(inst: int, tmp: Path, logs: bool) -> subprocess.Popen[bytes]:
    with open(tmp / f"sitl{inst}.log", "wb") as log:
        return subprocess.Popen(
            [str(RUN_COPTER), "-I", str(inst), "--speedup", f"{SPEEDUP:g}", "--wipe",
             *(() if logs else ("--no-logs",)), "--dir", str(tmp / f"sitl{inst}")],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip


def _spawn_all(n: int, tmp: Path, procs: list[subprocess.Popen[bytes]], logs: bool) -> None:
    """Into `procs` as they start, so those already started are stopped if a later one fails."""
    procs.extend(_spawn(FIRST_INSTANCE + k, tmp, logs) for k in range(n))  # extend appends as the generator yields


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM (SITL exits within ~2 s), SIGKILL after 10 s."""
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)


@asynccontextmanager
async def sitl_vehicles(n: int, tmp: Path, *, logs: bool = False) -> AsyncIterator[Site]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        await anyio.to_thread.run_sync(_spawn_all, n, tmp, procs, logs)
        # SITL's clock starts when the gateway connects; the gateway retries until the port listens.
        base = [5760 + 10 * (FIRST_INSTANCE + k) for k in range(n)]

        async def serial(k: int, link_id: int) -> str:
            assert link_id in (1, 2), "SITL listens on SERIAL0..2 (TCP 5760, 5762, 5763 + 10 N)"
            return f"tcp:127.0.0.1:{base[k] + 1 + link_id}"

        def log_file(k: int, log_id: int) -> bytes | None:
            # ArduPilot's AP_Logger_File names them logs/00000001.BIN ... in its working dir.
            path = tmp / f"sitl{FIRST_INSTANCE + k}" / "logs" / f"{log_id:08d}.BIN"
            return path.read_bytes() if path.is_file() else None

        yield Site(endpoints=[f"tcp:127.0.0.1:{port}" for port in base], serial=serial, log_file=log_file)
    finally:
        await anyio.to_thread.run_sync(_stop, procs)


SIM = Peer(name="sim", start=sim_vehicles, armable_within_s=20.0)
SITL = Peer(name="sitl", start=sitl_vehicles, armable_within_s=60.0)
