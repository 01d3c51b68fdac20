"""`mavjet gateway --workers N`: N processes split one gateway's fleet, one supervisor, one /metrics.

Which worker serves a vehicle is decided once, by `owner()`: a stable hash of
its vid modulo N (CRC-32, not Python's salted `hash`). So across restarts
of a worker, and across restarts of the whole hub with the same N, a vehicle's
link, twin, shadow reconciler and commands (the worker's TWIN_CMD consumer)
live in exactly one process. That is a command-safety rule, not a tidiness one:
two processes pulling the same vehicle's commands would each fetch some of
them, and the one without the vehicle's link could neither
send them nor observe the vehicle to confirm a redelivered one; two links to
one autopilot would also interleave MAVLink command and mission transfers the
protocol expects to be one at a time. Changing N moves vehicles between
workers' state dirs (`state_dir/worker-I`: spool and command ledger), so
change it with the hub stopped (docs/deploy.md).

A shared UDP listen port (many vehicles on 14550, told apart by sysid) is
bound here, in the supervisor, once per worker owning vehicles on it, all with
SO_REUSEPORT, and each worker is handed its socket. Plain SO_REUSEPORT
spreads datagrams by a hash of the sender's address: one source always lands
on the same socket, but not necessarily on the worker that owns its vehicle.
So a classic BPF program (`steering_program`) is attached to the group: it
reads the first frame's sysid from the datagram (as `UdpHub` does) and returns
the owning worker's socket index; anything else (not MAVLink, an unknown
sysid) falls back to the kernel's hash and is counted as unknown there. The
supervisor keeps every socket open, so a socket's index in the group (the
order of binding) never changes while a worker restarts, and datagrams for a
restarting worker wait in its socket's buffer instead of reaching another.
The supervisor is never in the data path.

Supervision: a worker that exits is restarted with exponential backoff;
`RestartPolicy` gives up (exit 1) when a worker fails `max_failures` times
within `window_s`, and a worker's exit 2 (a configuration error) stops the
hub with 2. A worker reports READY and WATCHDOG to the supervisor through the
sd_notify protocol (gateway/runtime/sdnotify.py, a socket per worker); one silent for
`hung_after_s` is killed and restarted. SIGTERM/SIGINT to the supervisor sends
SIGTERM to every worker, which drains as a single gateway does; the wait is
shielded and bounded, then SIGKILL.

One module on purpose: the slicing, the kernel steering and the supervisor
decide together which one process holds a vehicle's command consumer, and are
reviewed as one piece.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import anyio
import structlog
from anyio.abc import Process

from mavjet.contract.errors import ConfigError
from mavjet.contract.redact import redact
from mavjet.drivers.mavlink.transport import Endpoint
from mavjet.gateway.config import GatewayConfig, VehicleConfig
from mavjet.gateway.runtime.metrics import WorkersMetrics, WorkerStatus
from mavjet.gateway.runtime.sdnotify import Notifier

log = structlog.get_logger("mavjet.workers")

ENV_METRICS_FD = "MAVJET_WORKER_METRICS_FD"
ENV_UDP_FDS = "MAVJET_WORKER_UDP_FDS"
ENV_PARENT = "MAVJET_WORKER_PARENT"
WATCHDOG_USEC = 5_000_000  # workers ping every 2.5 s


def owner(vid: str, workers: int) -> int:
    """The worker serving `vid`: stable across processes, restarts and Python versions."""
    return zlib.crc32(vid.encode()) % workers


def slices(vehicles: Sequence[VehicleConfig], workers: int) -> list[tuple[VehicleConfig, ...]]:
    out: list[list[VehicleConfig]] = [[] for _ in range(workers)]
    for v in vehicles:
        out[owner(v.vid, workers)].append(v)
    return [tuple(s) for s in out]


# -- the shared UDP port: kernel steering by sysid ---------------------------------------------------------------

SO_ATTACH_REUSEPORT_CBPF = 51  # linux/asm-generic/socket.h
_LD_LEN, _LDB_ABS, _JEQ, _JGE, _JA, _RET = 0x80, 0x30, 0x15, 0x35, 0x05, 0x06
FALLBACK = 0xFFFFFFFF  # an index past the group: the kernel falls back to its hash


def steering_program(table: Mapping[int, int]) -> list[tuple[int, int, int, int]]:
    """cBPF (code, jt, jf, k) returning the socket index for a datagram's first-frame sysid.

    For SO_ATTACH_REUSEPORT_CBPF the kernel runs the program with the data
    starting at the UDP payload. MAVLink 2 (0xFD) has the sysid at byte 5,
    MAVLink 1 (0xFE) at byte 3, as `mavjet.drivers.mavlink.udphub.sysid_of` reads it.
    """
    prog = [
        (_LD_LEN, 0, 0, 0),
        (_JGE, 1, 0, 6),            # shorter than a v1 header: fall back
        (_RET, 0, 0, FALLBACK),
        (_LDB_ABS, 0, 0, 0),
        (_JEQ, 0, 2, 0xFE),
        (_LDB_ABS, 0, 0, 3),        # v1: sysid at 3
        (_JA, 0, 0, 6),             # to the table
        (_JEQ, 1, 0, 0xFD),
        (_RET, 0, 0, FALLBACK),     # not MAVLink
        (_LD_LEN, 0, 0, 0),
        (_JGE, 1, 0, 10),           # shorter than a v2 header: fall back
        (_RET, 0, 0, FALLBACK),
        (_LDB_ABS, 0, 0, 5),        # v2: sysid at 5
    ]
    for sysid, index in sorted(table.items()):
        prog += [(_JEQ, 0, 1, sysid), (_RET, 0, 0, index)]
    prog.append((_RET, 0, 0, FALLBACK))
    return prog


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


def bind_shared(endpoint: Endpoint, table: Mapping[int, int], count: int) -> list[socket.socket]:
    """`count` sockets on one UDP port, in index order, steered by `table` (sysid -> index)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            socks.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
            s.bind((endpoint.host, endpoint.port))
        prog = steering_program(table)
        filters = (_SockFilter * len(prog))(*(_SockFilter(*ins) for ins in prog))
        fprog = _SockFprog(len(prog), ctypes.cast(filters, ctypes.POINTER(_SockFilter)))
        socks[0].setsockopt(socket.SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, bytes(fprog))  # type: ignore[call-overload]
    except OSError as exc:
        for s in socks:
            s.close()
        raise ConfigError("vehicles.endpoint", f"cannot share {endpoint} between workers: {exc.strerror or exc}") from None
    return socks


def shared_ports(cfg: GatewayConfig, workers: int) -> dict[str, tuple[list[int], dict[int, int]]]:
    """Per shared UDP port: the workers owning vehicles on it (socket order) and sysid -> socket index."""
    out: dict[str, tuple[list[int], dict[int, int]]] = {}
    hub_vehicles = [v for v in cfg.vehicles if v.endpoint.scheme == "udp" and v.sysid is not None]
    for ep in sorted({str(v.endpoint) for v in hub_vehicles}):
        on_port = [v for v in hub_vehicles if str(v.endpoint) == ep]
        order = sorted({owner(v.vid, workers) for v in on_port})
        out[ep] = (order, {v.sysid: order.index(owner(v.vid, workers)) for v in on_port if v.sysid is not None})
    return out


# -- a worker's side ------------------------------------------------------------------------------------------------


def _die_with_parent(parent: int) -> None:
    """SIGTERM this worker when the supervisor dies (even by SIGKILL): no orphan keeps a vehicle's consumer."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before the prctl
        os.kill(os.getpid(), signal.SIGTERM)


def worker_setup(
    cfg: GatewayConfig, slot: str, environ: Mapping[str, str]
) -> tuple[GatewayConfig, dict[str, socket.socket], socket.socket | None]:
    """The config of worker `I/N` (its vehicles, state dir), its shared UDP sockets and its metrics socket.

    Both kinds of socket are the supervisor's, inherited: the metrics one
    listens on loopback already, so the worker binds no port of its own.
    """
    index_s, _, count_s = slot.partition("/")
    if not (index_s.isdigit() and count_s.isdigit() and int(index_s) < int(count_s)):
        raise ConfigError("--worker-slot", f"{slot!r}: expected I/N with I < N")
    index, count = int(index_s), int(count_s)
    mine = slices(cfg.vehicles, count)[index]
    if not mine:
        raise ConfigError("--worker-slot", f"worker {index} of {count} has no vehicles")
    vids = {v.vid for v in mine}
    fd = environ.get(ENV_METRICS_FD, "")
    metrics = socket.socket(fileno=int(fd)) if fd.isdigit() else None
    socks = {ep: socket.socket(fileno=fd) for ep, fd in json.loads(environ.get(ENV_UDP_FDS) or "{}").items()}
    if environ.get(ENV_PARENT, "").isdigit():
        _die_with_parent(int(environ[ENV_PARENT]))
    structlog.contextvars.bind_contextvars(worker=index)
    return dataclasses.replace(
        cfg, vehicles=mine, workers=1, state_dir=cfg.state_dir / f"worker-{index}", instance=f"{cfg.instance}-w{index}",
        routes=tuple(r for r in cfg.routes if r.vid in vids or r.vid is None),  # None: the only vehicle's
        metrics_port=None,  # served on the inherited socket instead
    ), socks, metrics


# -- the supervisor ---------------------------------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class RestartPolicy:
    """Sans-IO: how long to wait before restarting a worker, or None to give up (a crash loop)."""

    initial_s: float = 0.5
    max_s: float = 30.0
    max_failures: int = 5
    window_s: float = 60.0
    _failures: dict[int, list[float]] = field(default_factory=dict)

    def on_exit(self, worker: int, now_s: float) -> float | None:
        recent = [t for t in self._failures.get(worker, []) if now_s - t < self.window_s] + [now_s]
        self._failures[worker] = recent
        if len(recent) > self.max_failures:
            return None
        return float(min(self.max_s, self.initial_s * 2 ** (len(recent) - 1)))


@dataclass(slots=True, kw_only=True)
class _Slot:
    index: int
    vehicles: tuple[VehicleConfig, ...]
    metrics: socket.socket  # listening on 127.0.0.1, passed to each run of the worker
    notify: socket.socket
    notify_address: str
    fds: dict[str, int] = field(default_factory=dict)
    process: Process | None = None
    ready: bool = False
    restarts: int = 0
    last_ping_s: float = 0.0


def _metrics_listener() -> socket.socket:
    """A worker's /metrics socket, bound and listening here for the supervisor's whole run."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    return s


class Supervisor:
    def __init__(self, cfg: GatewayConfig, argv: Sequence[str], *, hung_after_s: float = 30.0,
                 policy: RestartPolicy | None = None) -> None:
        self.cfg = cfg
        self.argv = list(argv)
        self.hung_after_s = hung_after_s
        self.policy = policy or RestartPolicy()
        self.stopping = anyio.Event()
        self.exit_code = 0
        self._sockets: list[socket.socket] = []
        self.slots: list[_Slot] = []
        for i, vehicles in enumerate(slices(cfg.vehicles, cfg.workers)):
            if not vehicles:
                log.warning("worker_idle", worker=i, reason="no vehicle hashes to it")
                continue
            notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            name = f"@mavjet-{os.getpid()}-{i}-{secrets.token_hex(4)}"
            notify.bind(b"\0" + name[1:].encode())
            notify.setblocking(False)
            self.slots.append(_Slot(index=i, vehicles=vehicles, metrics=_metrics_listener(),
                                    notify=notify, notify_address=name))
        by_index = {s.index: s for s in self.slots}
        for ep, (order, table) in shared_ports(cfg, cfg.workers).items():
            socks = bind_shared(Endpoint.parse(ep), table, len(order))
            self._sockets += socks
            for worker, sock in zip(order, socks, strict=True):
                by_index[worker].fds[ep] = sock.fileno()
        self.metrics = WorkersMetrics(self.status)

    def status(self) -> list[WorkerStatus]:
        return [WorkerStatus(worker=str(s.index), metrics_port=s.metrics.getsockname()[1], running=s.process is not None,
                             ready=s.ready, restarts=s.restarts, vehicles=len(s.vehicles)) for s in self.slots]

    def request_stop(self, reason: str) -> None:
        if not self.stopping.is_set():
            log.info("workers_stopping", reason=reason)
        self.stopping.set()

    def _fail(self, code: int, **why: object) -> None:
        log.error("workers_failed", exit_code=code, **why)
        self.exit_code = max(self.exit_code, code)
        self.request_stop("worker failed")

    async def _spawn(self, slot: _Slot) -> Process:
        env = {k: v for k, v in os.environ.items() if k not in ("WATCHDOG_PID", "LISTEN_PID", "LISTEN_FDS")}
        env.update({"NOTIFY_SOCKET": slot.notify_address, "WATCHDOG_USEC": str(WATCHDOG_USEC),
                    ENV_METRICS_FD: str(slot.metrics.fileno()), ENV_UDP_FDS: json.dumps(slot.fds),
                    ENV_PARENT: str(os.getpid())})
        cmd = [sys.executable, "-m", "mavjet.ops", "gateway", *self.argv,
               "--worker-slot", f"{slot.index}/{self.cfg.workers}"]
        # A session of its own: Ctrl-C reaches the supervisor only, which stops the workers in order.
        proc = await anyio.open_process(cmd, stdin=subprocess.DEVNULL, stdout=None, stderr=None, env=env,
                                        pass_fds=(*slot.fds.values(), slot.metrics.fileno()), start_new_session=True)
        slot.last_ping_s = time.monotonic()
        log.info("worker_started", worker=slot.index, pid=proc.pid, vehicles=len(slot.vehicles))
        return proc

    async def _run_once(self, slot: _Slot, proc: Process) -> int:
        async def stop_on_request() -> None:
            await self.stopping.wait()
            with anyio.CancelScope(shield=True):  # the drain must finish even when we are being cancelled
                if proc.returncode is None:
                    proc.send_signal(signal.SIGTERM)
                with anyio.move_on_after(self.cfg.shutdown_timeout_s + 15):
                    await proc.wait()
                if proc.returncode is None:
                    log.warning("worker_killed", worker=slot.index, reason="did not stop in time")
                    proc.kill()

        async with anyio.create_task_group() as tg:
            tg.start_soon(stop_on_request)
            rc = await proc.wait()
            tg.cancel_scope.cancel()
        return rc

    async def _keep_running(self, slot: _Slot) -> None:
        while not self.stopping.is_set():
            proc = slot.process = await self._spawn(slot)
            try:
                rc = await self._run_once(slot, proc)
            finally:
                slot.process, slot.ready = None, False
            if self.stopping.is_set():
                log.info("worker_stopped", worker=slot.index, rc=rc)
                return
            log.warning("worker_exited", worker=slot.index, rc=rc)
            if rc == 2:  # a configuration error: restarting repeats it
                self._fail(2, worker=slot.index, reason="configuration error (see the worker's log line)")
                return
            delay = self.policy.on_exit(slot.index, time.monotonic())
            if delay is None:
                self._fail(1, worker=slot.index, reason=f"failed {self.policy.max_failures + 1} times "
                           f"within {self.policy.window_s:g} s")
                return
            slot.restarts += 1
            log.info("worker_restarting", worker=slot.index, delay_s=delay)
            with anyio.move_on_after(delay):
                await self.stopping.wait()

    async def _listen(self, slot: _Slot, notifier: Notifier) -> None:
        """READY and WATCHDOG from one worker; all ready: READY to systemd."""
        while True:
            await anyio.wait_readable(slot.notify)
            try:
                data = slot.notify.recv(4096)
            except BlockingIOError:
                continue
            slot.last_ping_s = time.monotonic()
            if b"READY=1" in data.split(b"\n") and slot.process is not None and not slot.ready:
                slot.ready = True
                log.info("worker_ready", worker=slot.index)
                if all(s.ready for s in self.slots):
                    log.info("workers_ready", workers=len(self.slots), vehicles=len(self.cfg.vehicles))
                    notifier.ready()
                    notifier.status(f"{len(self.slots)} workers, {len(self.cfg.vehicles)} vehicles")

    async def _watch(self, notifier: Notifier) -> None:
        """Kill a worker that stopped pinging (a hung event loop); ping systemd while we run."""
        own = notifier.watchdog_interval_s
        while True:
            now = time.monotonic()
            for slot in self.slots:
                if slot.process is not None and now - slot.last_ping_s > self.hung_after_s:
                    log.warning("worker_hung", worker=slot.index, silent_s=round(now - slot.last_ping_s, 1))
                    slot.last_ping_s = now
                    slot.process.kill()
            if own:
                notifier.watchdog()
            await anyio.sleep(min(1.0, own or 1.0))

    async def _signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for sig in signals:
                self.request_stop(signal.Signals(sig).name)

    async def run(self) -> int:
        notifier = Notifier.from_env(os.environ)
        try:
            if self.cfg.metrics_port is not None:
                port = self.metrics.serve(self.cfg.metrics_host, self.cfg.metrics_port)
                log.info("workers_metrics", port=port)
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._signals, name="workers.signals")
                tg.start_soon(self._watch, notifier, name="workers.watchdog")
                async with anyio.create_task_group() as workers:
                    for slot in self.slots:
                        tg.start_soon(self._listen, slot, notifier, name=f"worker[{slot.index}].notify")
                        workers.start_soon(self._keep_running, slot, name=f"worker[{slot.index}]")
                notifier.stopping()
                tg.cancel_scope.cancel()
        finally:
            for slot in self.slots:
                if slot.process is not None and slot.process.returncode is None:
                    slot.process.kill()
                slot.notify.close()
                slot.metrics.close()
            for s in self._sockets:
                s.close()
            notifier.close()
        log.info("workers_stopped", exit_code=self.exit_code)
        return self.exit_code


def supervise(cfg: GatewayConfig, argv: Sequence[str]) -> int:
    """`mavjet gateway --workers N`: run the workers until SIGTERM; 0 clean, 1 a crash loop, 2 a config error."""
    try:
        sup = Supervisor(cfg, argv)
    except ConfigError as exc:  # a shared port we cannot bind: one line, exit 2, as preflight's errors
        print(redact(f"mavjet gateway: {exc}"), file=sys.stderr)
        return 2
    backend_options = {"use_uvloop": True} if cfg.uvloop else {}
    return anyio.run(sup.run, backend="asyncio", backend_options=backend_options)
