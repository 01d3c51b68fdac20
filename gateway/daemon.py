"""The gateway daemon: `Gateway`, one supervising task group for the whole fleet.

One supervising task group owns every task, each named after what it serves
(`vehicle[VID-001].link`, `nats.spool_drainer`, ...). Startup waits (bounded)
until each link has heard its vehicle, then tells systemd READY. A stop
request (SIGTERM or SIGINT, caught by the process entry, gateway/entry.py)
stops intake, records `gateway_stopped`, drains the spool and NATS, and closes
the links; the process exits 0.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Mapping
from typing import Any

import anyio
import anyio.lowlevel
import structlog
from anyio.abc import TaskGroup, TaskStatus

from mavjet.contract.events import EventType
from mavjet.drivers.mavlink.reactor import set_urgent
from mavjet.drivers.mavlink.udphub import UdpHub
from mavjet.gateway.config import GatewayConfig
from mavjet.gateway.ownership.keeper import AlwaysOwner
from mavjet.gateway.ownership.service import DaemonOwnership
from mavjet.gateway.publish.digest import DigestPublisher
from mavjet.gateway.publish.publisher import Publisher
from mavjet.gateway.publish.spool import Spool
from mavjet.gateway.runtime.metrics import GatewayMetrics
from mavjet.gateway.services import Drainable, Foreground, GatewayService, ServiceContext
from mavjet.gateway.stores.recorder import TrackRecorder
from mavjet.gateway.twin.clock import GatewayClock
from mavjet.gateway.twin.samples import ReadyStates, StateSample
from mavjet.gateway.twin.vehicle import VehicleTwin, collect_fleet_due, collect_fleet_links

log = structlog.get_logger("mavjet.gateway")
# The longest the fleet-wide state tick holds the event loop before it yields (see `_ticker`):
# while a command runs, and otherwise.
TICK_STEP_S = 0.003
TICK_IDLE_STEP_S = 0.020
# Overload: when the rest of the loop (reading MAVLink) holds it longer than a step between two
# steps, the idle step grows to match, up to this: state gets as much of the loop as reading, not
# 20 ms of every pass of hundreds. 4,000 vehicles on 2 cores (knee 2,000): 32.6k → 42.2k state/s
# stored, p99 1.16 → 1.52 s (each hop of a sample through the loop waits for a longer pass).
TICK_MAX_IDLE_STEP_S = 0.100
# How often the loop-lag probe wakes (`mavjet_event_loop_lag_seconds`): 20 timers a second cost nothing.
LAG_PROBE_S = 0.05
# A stop with ownership (`Gateway._hand_over`): how long the command in flight may take to finish, and
# the bound on deleting the leases (a lease not deleted expires after its TTL: a standby takes over then).
HANDOVER_DRAIN_S = 5.0
RELEASE_TIMEOUT_S = 2.0
# Queued samples published per buffer write (~1 µs each), with a yield between steps as for the twins.
READY_CHUNK = 256


class _StepBudget:
    """The idle step's length, carried from tick to tick: the last gap between two steps, bounded."""

    __slots__ = ("idle_s",)

    def __init__(self) -> None:
        self.idle_s = TICK_IDLE_STEP_S

    def after_gap(self, gap_s: float) -> None:
        self.idle_s = min(TICK_MAX_IDLE_STEP_S, max(TICK_IDLE_STEP_S, gap_s))


def _urgent(busy: bool) -> None:
    """A command started (True) or the last one ended (False): the fleet's reads keep their passes
    short meanwhile (drivers/mavlink/reactor.py), as the state tick keeps its steps (`_TickSteps`)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not on an asyncio loop: there is no reactor to tell
        return
    set_urgent(loop, busy)


class _TickSteps:
    """The tick's clock: the step ends at `end_s` (time.perf_counter()), `next()` yields and starts the next."""

    __slots__ = ("_budget", "_foreground", "end_s")

    def __init__(self, foreground: Foreground, budget: _StepBudget) -> None:
        self._foreground = foreground
        self._budget = budget
        self.end_s = 0.0
        self.start()

    def start(self) -> None:
        self.end_s = time.perf_counter() + (TICK_STEP_S if self._foreground.active else self._budget.idle_s)

    def spent(self) -> bool:
        return time.perf_counter() >= self.end_s

    async def next(self) -> None:
        yielded = time.perf_counter()
        await anyio.lowlevel.checkpoint()
        self._budget.after_gap(time.perf_counter() - yielded)
        self.start()


class LinkRota:
    """Whose link channel is due this tick: the fleet spread round-robin over the link period.

    Every vehicle's link channel in one tick was a burst at the same instant of each second (1,000
    samples packed and written at once), and the loop's late turns came at that instant. Spread,
    each vehicle still gets one a period, the first vehicle at once and the last a period later.
    A stalled loop owes at most one a vehicle: a late liveness record is replaced, not repeated.
    """

    __slots__ = ("_cursor", "_last_ns", "_n", "_owed", "_period_ns")

    def __init__(self, n: int, period_ns: int, now_ns: int) -> None:
        self._n = n
        self._period_ns = period_ns
        self._last_ns = now_ns
        self._owed = 1.0 if n else 0.0
        self._cursor = 0

    def take(self, now_ns: int) -> list[int]:
        """The indices due at `now_ns`, each at most once a call, in round-robin order."""
        n = self._n
        if not n:
            return []
        self._owed = min(float(n), self._owed + n * max(0, now_ns - self._last_ns) / self._period_ns)
        self._last_ns = now_ns
        k = int(self._owed)
        self._owed -= k
        start = self._cursor
        self._cursor = (start + k) % n
        return [(start + j) % n for j in range(k)]


class Gateway:
    """The daemon as an object, so tests and benchmarks can run it in-process."""

    def __init__(self, cfg: GatewayConfig, *, hub_sockets: Mapping[str, socket.socket] | None = None,
                 metrics_socket: socket.socket | None = None) -> None:
        self.cfg = cfg
        self.metrics = GatewayMetrics()
        self._metrics_socket = metrics_socket
        self.spool = Spool(cfg.state_dir / "spool.sqlite", max_entries=cfg.spool_max_events)
        self.publisher = Publisher(cfg, self.spool, self.metrics)
        # A udp: vehicle with a sysid listens through a hub socket, one per
        # port, demultiplexed by sysid (GatewayConfig makes every vehicle on a
        # shared port such a vehicle).
        self.hubs: dict[str, UdpHub] = {}
        for v in cfg.vehicles:
            if v.endpoint.scheme == "udp" and v.sysid is not None and str(v.endpoint) not in self.hubs:
                # `hub_sockets`: a worker's share of a port its parent bound (gateway/runtime/workers.py).
                self.hubs[str(v.endpoint)] = UdpHub(v.endpoint, bound=(hub_sockets or {}).get(str(v.endpoint)))
        # Samples due when they arrived, queued by the twins for the next tick (the common case), and
        # twins holding a sample not yet due: the ticker publishes the first and visits only these.
        self._ready = ReadyStates()
        self._dirty: set[VehicleTwin] = set()
        # The one clock of every state sample and event time (gateway/twin/clock.py).
        self.clock = GatewayClock()
        self.twins = {
            v.vid: VehicleTwin(v, cfg, self.publisher, self.metrics, hub=self.hubs.get(str(v.endpoint)),
                               on_fresh=self._dirty.add, ready=self._ready, clock=self.clock)
            for v in cfg.vehicles
        }
        self.metrics.watch_sessions(lambda: [t.session for t in self.twins.values()])
        self.metrics.watch_superseded(lambda: sum(t.superseded for t in self.twins.values()))
        self.metrics.watch_signing(lambda: [(t.vid, t.link.codec.stats.signing_rejected) for t in self.twins.values()])
        self.metrics_port: int | None = None
        self.ready = anyio.Event()
        self.stopping = anyio.Event()
        self._stop_reason = "stopped"
        self._notifier: Any = None
        # Commands, shadow: started once the links are, cancelled at shutdown.
        self.services: list[GatewayService] = []
        self._services_scope: anyio.CancelScope | None = None
        # One owner per vehicle (docs/ownership.md): the twins publish and the links act only while this
        # gateway holds the vehicle's lease.
        self.ownership = DaemonOwnership(instance=cfg.instance, env=cfg.env, twins=self.twins,
                                         publisher=self.publisher, metrics=self.metrics) if cfg.ownership else None
        own = self.ownership
        self.context = ServiceContext(cfg=cfg, vehicles=self.twins, nats=self.publisher, metrics=self.metrics,
                                      bulk=self.publisher.uplink, foreground=Foreground(on_change=_urgent),
                                      ownership=own.keeper if own is not None else AlwaysOwner(),
                                      leases=own.command_store if own is not None else None,
                                      holder=own.holder if own is not None else "")
        self._add_routes()
        if cfg.track_hz > 0:  # the flight recorder (gateway/stores/recorder.py): TWIN_TRACKS while armed
            self.services.append(TrackRecorder(cfg))
        if cfg.digest.hz > 0:  # a central cluster's decimated state (gateway/publish/digest.py)
            self.services.append(DigestPublisher(cfg.digest, env=cfg.env, instance=cfg.instance))

    def _add_routes(self) -> None:
        """Ground stations through the gateway (gateway/routes.py): `--route` endpoints and the NATS tunnel."""
        from mavjet.gateway.routes import RouteService, TunnelService

        taps = {vid: t.link for vid, t in self.twins.items()}
        locks = {vid: t.session.transfer_lock for vid, t in self.twins.items()}
        hubs: list[Any] = []
        if self.cfg.routes:
            routes = RouteService(self.cfg.routes, taps=taps, locks=locks)
            self.services.append(routes)
            hubs.append(routes.hubs)
        tunnelled = tuple(v.vid for v in self.cfg.vehicles if self.cfg.tunnel_for(v))
        if tunnelled:
            tunnel = TunnelService(tunnelled, taps=taps, locks=locks)
            self.services.append(tunnel)
            hubs.append(tunnel.hubs)
        if hubs:
            self.metrics.watch_routes(lambda: [(vid, name, st) for by_vid in hubs for vid, hub in by_vid.items()
                                               for name, st in list(hub.stats.items())])

    def request_stop(self, reason: str = "stopped") -> None:
        self._stop_reason = reason
        self.stopping.set()

    async def _ticker(self) -> None:
        """One wake-up per tick for the whole fleet: publish what is fresh and due.

        A tick's work is cut into steps, each published and followed by a yield, so a command's
        delivery, its vehicle's ACK and its result do not wait behind a whole tick of state (the
        backlog of a loop that fell behind); the link channel is spread over its period
        (`LinkRota`), a share of the fleet each tick. Steps are
        `TICK_STEP_S` while a command runs (`ServiceContext.foreground`), else `TICK_IDLE_STEP_S`
        (up to `TICK_MAX_IDLE_STEP_S` while reading holds the loop longer, `_StepBudget`): every
        yield is another pass over the fleet's sockets, and at 2,000 vehicles 3 ms steps all the
        time cost a fifth of the state rate (44.6k → 35.0k samples/s). Order per channel holds:
        one task publishes, the queued samples (`ReadyStates`) before the twins' later ones.
        """
        twins = list(self.twins.values())
        dirty = self._dirty
        link_hz = self.cfg.rates_hz.get("link")
        clock = self.clock
        rota = LinkRota(len(twins), int(1e9 / link_hz), clock.now_ns()) if link_hz else None
        tick_gauge = self.metrics.loop_tick
        publish_states = self.publisher.publish_states
        foreground = self.context.foreground
        budget = _StepBudget()
        ready = self._ready
        while True:
            now_ns = clock.now_ns()
            tick_gauge.set(now_ns / 1e9)
            if ready.items:
                # Before the twins' rate-limited samples: each of those is newer than its
                # channel's queued one (a channel is queued or waiting, never both).
                queued = ready.take()
                steps = _TickSteps(foreground, budget)
                for start in range(0, len(queued), READY_CHUNK):
                    await publish_states(queued[start:start + READY_CHUNK])
                    if steps.spent():
                        await steps.next()
            if dirty:
                batch = list(dirty)
                dirty.clear()
                due: list[StateSample] = []
                steps = _TickSteps(foreground, budget)
                i = 0
                while i < len(batch):  # in steps (gateway/twin/vehicle.py collect_fleet_due)
                    i = collect_fleet_due(batch, i, now_ns, due, dirty=dirty, end_s=steps.end_s)
                    if i < len(batch):
                        if due:
                            await publish_states(due)  # one buffer write per step
                            due = []
                        await steps.next()
                if due:
                    await publish_states(due)
            if rota is not None and (due_links := rota.take(now_ns)):
                links: list[StateSample] = []
                steps = _TickSteps(foreground, budget)
                i = 0
                while i < len(due_links):
                    i = collect_fleet_links(twins, due_links, i, now_ns=now_ns, out=links, end_s=steps.end_s)
                    if i < len(due_links):
                        if links:
                            await publish_states(links)
                            links = []
                        await steps.next()
                if links:
                    await publish_states(links)
            await anyio.sleep(self.cfg.publish_tick_s)

    async def _lag_probe(self) -> None:
        """Observe how late each timer wake-up of this loop comes (the lag every hop through it may add)."""
        observe = self.metrics.loop_lag.observe
        while True:
            due = time.perf_counter() + LAG_PROBE_S
            await anyio.sleep(LAG_PROBE_S)
            observe(max(0.0, time.perf_counter() - due))

    async def _watchdog(self) -> None:
        n = self._notifier
        interval = getattr(n, "watchdog_interval_s", None)
        if not interval:
            return
        while True:
            n.watchdog()
            await anyio.sleep(interval)

    async def _startup(self) -> None:
        with anyio.move_on_after(self.cfg.startup_timeout_s):
            async with anyio.create_task_group() as tg:
                for twin in self.twins.values():
                    tg.start_soon(twin.session.wait_ready, name=f"vehicle[{twin.vid}].wait_ready")
            if self.ownership is not None:
                await self.ownership.settle()
        not_up = [t.vid for t in self.twins.values() if not t.session.is_up]
        if not_up:
            log.warning("startup_links_not_ready", vehicles=not_up, waited_s=self.cfg.startup_timeout_s)
        log.info("gateway_ready", vehicles=len(self.twins), nats=self.publisher.is_connected,
                 metrics_port=self.metrics_port)
        self.ready.set()
        if self._notifier is not None:
            self._notifier.ready()

    async def run(self) -> None:
        """Run until `request_stop()` (or cancellation); then shut down cleanly."""
        if self._metrics_socket is not None:  # a `--workers` worker: the supervisor's socket (gateway/runtime/workers.py)
            self.metrics_port = self.metrics.serve_on(self._metrics_socket)
        elif self.cfg.metrics_port is not None:
            self.metrics_port = self.metrics.serve(self.cfg.metrics_host, self.cfg.metrics_port)
        try:
            from mavjet.gateway.runtime.sdnotify import Notifier

            self._notifier = Notifier.from_env(os.environ)
        except ImportError:
            self._notifier = None
        try:
            async with anyio.create_task_group() as root:
                await root.start(self.publisher.run, name="nats.publisher")
                if self.ownership is not None:
                    await root.start(self.ownership.run, name="gateway.ownership")
                async with anyio.create_task_group() as intake:
                    for twin in self.twins.values():
                        await intake.start(twin.run, name=f"vehicle[{twin.vid}].link")
                    intake.start_soon(self._ticker, name="gateway.state_ticker")
                    intake.start_soon(self._watchdog, name="gateway.watchdog")
                    intake.start_soon(self._lag_probe, name="gateway.loop_lag_probe")
                    # Each service started soon, not awaited: startup must not wait for a service
                    # (a service waiting for NATS would hold the links' readiness).
                    await intake.start(self._run_services, name="gateway.services")
                    await self._startup()
                    await self.stopping.wait()
                    if self.ownership is not None:
                        with anyio.CancelScope(shield=True):
                            await self._hand_over(self.ownership)
                    for twin in self.twins.values():
                        twin.closing = True
                    intake.cancel_scope.cancel()  # stop intake: links, ticker, commands
                with anyio.CancelScope(shield=True):
                    await self._shutdown(root)
        finally:
            for hub in self.hubs.values():
                hub.close()
            self.spool.close()

    async def _run_services(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tg:
            self._services_scope = tg.cancel_scope
            for svc in self.services:
                tg.start_soon(svc.run, self.context, name=f"gateway.{type(svc).__name__}")
            task_status.started()

    async def _hand_over(self, own: DaemonOwnership) -> None:
        """A stop with ownership: step down while the links and the state tick still run.

        No new command is taken and the one in flight gets `HANDOVER_DRAIN_S` to finish
        (then it is cancelled, its rows left in flight for the next owner's recovery);
        the owned vehicles' last events go out while this gateway still owns them; then
        the leases are deleted, and a standby, woken by the delete, takes over in a round
        trip. State keeps flowing from here until the release (docs/ownership.md, Handover).
        """
        if self._notifier is not None:
            self._notifier.stopping()
        log.info("gateway_handing_over", reason=self._stop_reason, owned=len(own.owned()))
        with anyio.move_on_after(HANDOVER_DRAIN_S):
            for svc in self.services:
                if isinstance(svc, Drainable):
                    await svc.drain()
        if self._services_scope is not None:
            self._services_scope.cancel()
        now_ns = self.clock.now_ns()
        for twin in self.twins.values():
            if twin.recording():  # the owner, or one that cannot know of another (its uplink down): spooled
                twin.flush_suppressed(now_ns, flush=True)
                twin.emit(EventType.GATEWAY_STOPPED, gateway=self.cfg.instance, reason=self._stop_reason)
        own.before_release(self._stop_reason)
        await own.release(timeout_s=RELEASE_TIMEOUT_S)

    async def _shutdown(self, root: TaskGroup) -> None:
        if self._notifier is not None and self.ownership is None:
            self._notifier.stopping()
        log.info("gateway_stopping", reason=self._stop_reason)
        now_ns = self.clock.now_ns()
        for twin in self.twins.values():
            if self.ownership is not None:  # said in `_hand_over`, before the leases went
                break
            twin.flush_suppressed(now_ns, flush=True)  # what the budget held back is reported before we go
            twin.emit(EventType.GATEWAY_STOPPED, gateway=self.cfg.instance, reason=self._stop_reason)
        await self.publisher.shutdown(self.cfg.shutdown_timeout_s)
        root.cancel_scope.cancel()
        log.info("gateway_stopped", spooled=self.spool.depth)


def with_services(gw: Gateway, *, commands: bool = True, shadow: bool = True) -> Gateway:
    """Add the command executor (TWIN_CMD) and the shadow reconciler (TWIN_SHADOW)."""
    if commands:
        from mavjet.gateway.commands.consumer import CommandService
        from mavjet.gateway.commands.logs import LogDownloadService

        gw.services.extend([CommandService(), LogDownloadService()])
    if shadow:
        from mavjet.gateway.shadow.service import ShadowService

        gw.services.append(ShadowService(gw.cfg.shadow))
    return gw
