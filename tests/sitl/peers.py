"""The vehicles a scenario runs against: the simulator (`sim/`) always, a real ArduCopter SITL and a real PX4 SITL
(SIH) when their binaries are at hand.

A peer's `start` is an async context manager that yields a `Site`: the MAVLink
endpoints (SERIAL0) of `n` fresh vehicles, and more ports of each on demand. The SITL peer starts `n` instances of the binary named by
ARDUCOPTER_BIN through the `run-copter` script of the shared SITL kit that
sits beside the repository (fresh eeprom, no dataflash logs), each in its own
working dir under the test's tmp dir, and stops them with SIGTERM. The PX4 peer
starts `n` instances of the binary named by PX4_BIN (`px4 -d -i N -w DIR ETC`
with the SIH quadrotor, `PX4_SIM_MODEL=sihsim_quadx`), each in a fresh working
dir, and talks to each one's GCS link over loopback UDP (18570 + N).
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
PX4_BIN_ENV = "PX4_BIN"
# PX4 instance N: GCS link on UDP 18570 + N (it answers whoever spoke to it first from 127.0.0.1), system id N + 1.
PX4_FIRST_INSTANCE = int(os.environ.get("PX4_FIRST_INSTANCE", "40"))
PX4_MODEL = "sihsim_quadx"  # airframe 10040: the built-in SIH quadrotor, no external simulator


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


def px4_missing() -> str | None:
    """Why the PX4 peer cannot run here, or None."""
    if not os.environ.get(PX4_BIN_ENV):
        return (f"PX4 SITL tier skipped: set {PX4_BIN_ENV} to a PX4 SITL binary (px4_sitl_default build with SIH) "
                "built from upstream PX4-Autopilot (no binary ships with mavjet)")
    binary = Path(os.environ[PX4_BIN_ENV])
    if not binary.is_file():
        return f"PX4 SITL tier skipped: {PX4_BIN_ENV}={binary} is not a file"
    if not (px4_etc(binary) / "init.d-posix" / "rcS").is_file():
        return f"PX4 SITL tier skipped: no rootfs {px4_etc(binary)} (init.d-posix/rcS) beside {binary}"
    return None


def px4_etc(binary: Path) -> Path:
    """The rootfs PX4 starts from: build/px4_sitl_default/etc beside build/px4_sitl_default/bin/px4."""
    return binary.resolve().parent.parent / "etc"


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
    name: str  # "sim", "sitl" or "px4"
    # `logs`: the vehicles keep dataflash logs (SITL runs with LOG_BACKEND_TYPE 0 otherwise: ~3 MB a minute).
    start: Start
    # Wall seconds for the autopilot to become armable after its start (SITL: EKF on GPS after ~40 s of its time).
    armable_within_s: float
    # The autopilot's names for what the scenarios use: modes and parameters differ between the flavours.
    names: Names


@dataclass(frozen=True, slots=True, kw_only=True)
class Names:
    """What a scenario asks of one autopilot flavour, in its own words."""

    flavour: str  # "ardupilot" or "px4"
    guided: str  # the mode that takes takeoff / goto commands
    other_mode: str  # a second mode, set on a disarmed vehicle on the ground
    auto: str  # the mission mode
    rtl_alt: tuple[str, float, float]  # an RTL parameter and two values to set it to
    shadow_params: dict[str, float]  # parameters the shadow sets
    mavproxy: bool  # the tunnel scenario in ArduPilot's names (tests/ops); else PX4's (tests/sitl/tunnel.py)

    def skip(self, scenario: str) -> str | None:
        """Why `scenario` does not apply to this flavour, or None."""
        return PX4_SKIPS.get(scenario) if self.flavour == "px4" else None


# Names ArduCopter 4.7 (the sim's model) and 4.8 both have: 4.8 renamed RTL_ALT (RTL_ALT_M), WPNAV_SPEED and
# others to SI units, and answers PARAM_ERROR DOES_NOT_EXIST for the old names.
ARDUPILOT_NAMES = Names(flavour="ardupilot", guided="GUIDED", other_mode="LOITER", auto="AUTO",
                        rtl_alt=("RTL_LOIT_TIME", 1800.0, 2500.0),  # INT32, ms
                        shadow_params={"RTL_LOIT_TIME": 2500, "FENCE_ALT_MAX": 75.5}, mavproxy=True)
# PX4: DO_REPOSITION and NAV_TAKEOFF are obeyed from AUTO.LOITER (the mode it idles in); RTL_RETURN_ALT in m.
PX4_NAMES = Names(flavour="px4", guided="AUTO.LOITER", other_mode="AUTO.LAND", auto="AUTO.MISSION",
                  rtl_alt=("RTL_RETURN_ALT", 18.0, 25.0),
                  shadow_params={"RTL_RETURN_ALT": 25.0, "MPC_XY_CRUISE": 7.5}, mavproxy=False)
PX4_SKIPS = {
    "signing": "PX4 SITL: the scenario relies on ArduPilot's SERIAL0..2 TCP ports and its signing rules (docs/signing.md)",
    "terrain": "PX4 has no terrain database (no TERRAIN_CHECK / TERRAIN_REPORT): a terrain-frame item is ArduPilot's",
    "geofence_shadow": "the shadow's geofence step writes ArduPilot's FENCE_* parameters, which PX4 does not have",
    "two_gateways": "PX4 SITL has one GCS link per instance here (udp 18570+N); the scenario needs SERIAL0 and SERIAL1",
}


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


def _listening(proto: str, port: int) -> bool:
    """Whether a local socket of `proto` ("tcp" / "udp") is bound to `port` (TCP: listening), from /proc/net.

    Read, never probed: a connect to SITL's SERIAL0 would take its one client slot and start its clock.
    """
    state = "0A" if proto == "tcp" else "07"  # TCP_LISTEN; an unconnected UDP socket reads TCP_CLOSE (07)
    for name in (proto, f"{proto}6"):
        path = Path("/proc/net") / name
        if not path.is_file():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            if len(fields) > 3 and fields[3] == state and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False


def _has_proc_net(proto: str) -> bool:
    return (Path("/proc/net") / proto).is_file()


async def wait_listening(proto: str, ports: list[int], procs: list[subprocess.Popen[bytes]], *,
                         within_s: float = 30.0) -> None:
    """Until every port is bound (bounded: `within_s`, 0.1 s steps), or fail naming the ports and an exited process."""
    if not _has_proc_net(proto):  # not Linux: the clients retry instead
        return
    for _ in range(int(within_s / 0.1)):
        if all(_listening(proto, port) for port in ports):
            return
        dead = [p.args for p in procs if p.poll() is not None]
        assert not dead, f"exited before listening: {dead}"
        await anyio.sleep(0.1)
    raise AssertionError(f"{proto} ports {ports} not listening within {within_s} s")


@asynccontextmanager
async def sitl_vehicles(n: int, tmp: Path, *, logs: bool = False) -> AsyncIterator[Site]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        await anyio.to_thread.run_sync(_spawn_all, n, tmp, procs, logs)
        # SITL's clock starts when the first client connects (the gateway, or `mavjet sign setup`): wait until
        # SERIAL0 listens, so a client that does not retry (sign setup) finds it. SERIAL1/2 open only once a
        # client is on SERIAL0.
        base = [5760 + 10 * (FIRST_INSTANCE + k) for k in range(n)]
        await wait_listening("tcp", base, procs)

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


def _spawn_px4(inst: int, tmp: Path) -> subprocess.Popen[bytes]:
    binary = Path(os.environ[PX4_BIN_ENV])
    work = tmp / f"px4-{inst}"  # parameters, dataman and logs: fresh for every scenario
    work.mkdir(parents=True, exist_ok=True)
    # PX4_NET_INTERFACE would make PX4 broadcast beyond localhost: never set here.
    env = {k: v for k, v in os.environ.items() if k != "PX4_NET_INTERFACE"} | {"PX4_SIM_MODEL": PX4_MODEL}
    with open(tmp / f"px4-{inst}.log", "wb") as log:
        return subprocess.Popen(
            [str(binary), "-d", "-i", str(inst), "-w", str(work), str(px4_etc(binary))],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=env,
        )  # fmt: skip


def _spawn_all_px4(n: int, tmp: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    procs.extend(_spawn_px4(PX4_FIRST_INSTANCE + k, tmp) for k in range(n))


def px4_log_path(work: Path, log_id: int) -> Path | None:
    """The file PX4 lists as `log_id`: its log handler numbers from 0 the regular files of each dated folder
    under log/, both in directory order (mavlink_log_handler.cpp `create_log_list_file`), as os.scandir reads it."""
    root = work / "log"
    if not root.is_dir():
        return None
    files = [f for d in os.scandir(root) if d.is_dir() for f in os.scandir(d.path) if f.is_file()]
    return Path(files[log_id].path) if 0 <= log_id < len(files) else None


def px4_gcs_port(inst: int) -> int:
    """The UDP port instance `inst`'s GCS link listens on (ROMFS px4-rc.mavlink: 18570 + N)."""
    return 18570 + inst


@asynccontextmanager
async def px4_vehicles(n: int, tmp: Path, *, logs: bool = False) -> AsyncIterator[Site]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        await anyio.to_thread.run_sync(_spawn_all_px4, n, tmp, procs)
        # `udpout:`: the gateway speaks first (its GCS heartbeat); PX4 then answers that address.
        ports = [px4_gcs_port(PX4_FIRST_INSTANCE + k) for k in range(n)]
        await wait_listening("udp", ports, procs)
        endpoints = [f"udpout:127.0.0.1:{port}" for port in ports]

        async def serial(k: int, link_id: int) -> str:
            raise AssertionError("the PX4 peer has one GCS link per vehicle")

        def log_file(k: int, log_id: int) -> bytes | None:
            path = px4_log_path(tmp / f"px4-{PX4_FIRST_INSTANCE + k}", log_id)
            return None if path is None else path.read_bytes()

        yield Site(endpoints=endpoints, serial=serial, log_file=log_file)
    finally:
        await anyio.to_thread.run_sync(_stop, procs)


SIM = Peer(name="sim", start=sim_vehicles, armable_within_s=20.0, names=ARDUPILOT_NAMES)
SITL = Peer(name="sitl", start=sitl_vehicles, armable_within_s=60.0, names=ARDUPILOT_NAMES)
PX4 = Peer(name="px4", start=px4_vehicles, armable_within_s=60.0, names=PX4_NAMES)
