"""One vehicle's twin inside the gateway: session + telemetry model + publishing.

The link calls `on_messages` synchronously for every batch it decodes; that
is the hot path (model update, event hand-off). State publishing happens on
the daemon's shared ticker. A sample is packed as it arrives; if its
channel's rate interval has passed, it is queued for the next tick
(`ReadyStates`), else it waits in the twin and `collect_due` gathers it once
due (decimate, never forward every MAVLink message: a vehicle sends far more
than any consumer wants, and each publish costs more than the decode).
`collect_link` adds the gateway-computed link channel. A due sample waits at
most one tick, so decimation adds little latency.

To services the twin is a `mavjet.gateway.services.VehicleHandle`: its MAVLink
session, a read-only telemetry view, its event stream and `publish_event`.

Times come from the gateway's one clock (gateway/twin/clock.py), read once per
received batch and once per tick. Events bound for TWIN_EVENTS pass the
vehicle's event budget (gateway/twin/budget.py); in-gateway subscribers still see
every event, as the telemetry model's state is never affected by the budget.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import anyio
import structlog
from anyio.abc import TaskStatus

from mavjet.contract import envelope
from mavjet.contract.events import EventType
from mavjet.contract.subjects import event_subject, state_subject
from mavjet.drivers.mavlink.backoff import Backoff
from mavjet.drivers.mavlink.dialect import MavMessage, mavlink2
from mavjet.drivers.mavlink.duallink import DualTransport
from mavjet.drivers.mavlink.link import LinkState, MavlinkLink
from mavjet.drivers.mavlink.signing import read_key_file
from mavjet.drivers.mavlink.transport import Transport
from mavjet.drivers.mavlink.udphub import UdpHub
from mavjet.drivers.mavlink.vehiclesession import VehicleSession
from mavjet.gateway.config import GatewayConfig, VehicleConfig
from mavjet.gateway.publish.publisher import Publisher
from mavjet.gateway.runtime.metrics import GatewayMetrics
from mavjet.gateway.services import EventBus, EventHandler
from mavjet.gateway.twin.budget import EventBudget
from mavjet.gateway.twin.clock import GatewayClock
from mavjet.gateway.twin.samples import EnvelopePacker, ReadyStates, StateChannel, StateSample
from mavjet.gateway.twin.telemetry import Event, TelemetryModel

log = structlog.get_logger("mavjet.vehicle")

_NEWEST_ONLY_ARMED = frozenset({mavlink2.MAVLINK_MSG_ID_ATTITUDE})
_NEWEST_ONLY_IDLE = frozenset({mavlink2.MAVLINK_MSG_ID_ATTITUDE, mavlink2.MAVLINK_MSG_ID_GLOBAL_POSITION_INT})


class VehicleTwin:
    def __init__(self, vcfg: VehicleConfig, cfg: GatewayConfig, publisher: Publisher, metrics: GatewayMetrics,
                 *, hub: UdpHub | None = None, on_fresh: Callable[[VehicleTwin], None] | None = None,
                 ready: ReadyStates, clock: GatewayClock | None = None) -> None:
        self.vid = vcfg.vid
        self.cfg = cfg
        self.clock = clock or GatewayClock()
        self.budget = EventBudget(cfg.event_budget)
        self.publisher = publisher
        self.metrics = metrics
        self.model = TelemetryModel(vid=vcfg.vid)
        self._packer = EnvelopePacker(vcfg.vid)
        self._vcfg = vcfg
        self._hub = hub
        self.dual: DualTransport | None = None  # with a backup endpoint: the two links behind this one
        # A shared udp port's vehicle reads through its hub; one with a backup through both links.
        factory: Callable[[], Awaitable[Transport]] | None = None
        if hub is not None and vcfg.sysid is not None:
            factory = self._hub_factory
        elif vcfg.backup is not None:
            factory = self._dual_factory

        self.link = MavlinkLink(
            name=vcfg.vid, endpoint=vcfg.endpoint, config=cfg.link,
            on_messages=self.on_messages, on_state=self.on_link_state,
            transport_factory=factory, expected_sysid=vcfg.sysid,
            signing_key=read_key_file(vcfg.signing_key_file) if vcfg.signing_key_file is not None else None,
        )
        self.session = VehicleSession(self.link, protocols=cfg.protocols, flight_state=self.model)
        # A read that fell behind decodes only the newest of these per source (drivers/mavlink/framer.py):
        # their older samples would be superseded before publishing anyway. Positions are all decoded
        # while armed, where the flight's distance and highest altitude are summed from each.
        self._armed_rule = False
        self.link.codec.newest_only = _NEWEST_ONLY_IDLE
        self.events = EventBus(vcfg.vid)
        # The full interval: publish times follow a fixed schedule (see
        # collect_due), so tick jitter does not lower the rate and the
        # configured rate is a true upper bound.
        self._channels = {ch: StateChannel(state_subject(cfg.env, vcfg.vid, ch), int(1e9 / hz))
                          for ch, hz in cfg.rates_hz.items() if ch != "link"}
        self._link_subject = state_subject(cfg.env, vcfg.vid, "link") if "link" in cfg.rates_hz else None
        self.fresh: set[StateChannel] = set()  # channels with a sample not yet due (rate-limited)
        # Samples due on arrival go to the fleet's queue for the next tick (ReadyStates).
        self.ready = ready
        # Samples taken for publishing: queued in `ready` on arrival or out of `fresh` by
        # `collect_due` (and those of a channel with no rate, never published).
        # With the model's `samples`, this gives `superseded`.
        self.samples_taken = 0
        self._next_due_ns = 0  # earliest time a fresh channel may go out; 0: check now
        # The daemon's ticker: told (with self) when a channel gets a new sample.
        self.on_fresh = on_fresh
        self._link_period_s = round(1.0 / cfg.rates_hz["link"], 3) if cfg.rates_hz.get("link") else None
        self._lost_at_mono: float | None = None
        self._was_up = False
        self._last_msgs = 0
        self._last_link_pub_mono = time.monotonic()
        self._error_logged: dict[str, float] = {}
        self.closing = False  # set at shutdown: our own disconnect is not a lost link
        # Whether this gateway may act for (and publish as) the vehicle now: its owner, not fenced
        # (gateway/ownership; the daemon sets it, and the link's gate, when ownership is on). A
        # standby decodes everything, so it can take over at once, and publishes nothing.
        self.acting: Callable[[], bool] = _always
        # Whether what the vehicle says is recorded (state and events published or spooled): the owner's
        # job, and that of a gateway that cannot know of another owner (its uplink down); not a standby's.
        self.recording: Callable[[], bool] = _always
        self.announce_on_start = True  # gateway_started at run(); with ownership, when the lease is won
        # With ownership: this gateway's identity and term for the link record (who publishes is the owner).
        self.lease_info: Callable[[], dict[str, Any]] | None = None

    async def _hub_factory(self) -> Transport:
        hub, sysid = self._hub, self._vcfg.sysid
        assert hub is not None and sysid is not None
        return hub.port_for(sysid)

    async def _dual_factory(self) -> Transport:
        """The link's transport with a backup endpoint: both links as one (drivers/mavlink/duallink.py)."""
        backup = self._vcfg.backup
        assert backup is not None
        self.dual = DualTransport(self._vcfg.endpoint, backup, connect_timeout_s=self.cfg.link.connect_timeout_s)
        return self.dual

    # -- hot path ----------------------------------------------------------
    def on_messages(self, msgs: list[MavMessage], link_recv_ns: int) -> None:
        # The link stamps batches with the wall clock, which can jump; the
        # twin's times come from the gateway clock, one read per batch.
        recv_ns = self.clock.now_ns()
        model = self.model
        try:
            model.update_many(msgs, recv_ns)
        except Exception:  # one bad message must never take the vehicle down
            self.report_error("telemetry")
        if (model.armed is True) is not self._armed_rule:
            self._armed_rule = model.armed is True
            self.link.codec.newest_only = _NEWEST_ONLY_ARMED if self._armed_rule else _NEWEST_ONLY_IDLE
        updated = model.updated
        if updated and not self.recording():
            updated.clear()  # a standby: decoded, not published
        if updated:
            # Each new sample is packed now, while its dict is in the CPU's cache: at the
            # publish tick, after a thousand other vehicles' batches, the same pack took
            # twice as long (docs/performance.md). A sample is the channel as of its own
            # time, so a VFR_HUD or BATTERY_STATUS enriching it later rides on the next one.
            published, pack, fresh = self._channels, self._packer.pack, self.fresh
            channels, sample_ns = model.channels, model.sample_ns
            ready = self.ready
            gen, queue = ready.gen, ready.items
            pending = False
            for name in updated:
                chan = published.get(name)
                if chan is None:  # no rate configured: never published
                    self.samples_taken += 1
                    continue
                try:
                    payload = pack(sample_ns[name], channels[name])
                except Exception:  # that sample is lost; the vehicle and its other channels go on
                    self.samples_taken += 1
                    self.report_error("telemetry")
                    continue
                if chan.ready_gen == gen:  # queued for the next tick: the newer sample takes its place
                    queue[chan.ready_idx] = (chan.subject, payload, recv_ns)
                    continue
                if recv_ns >= chan.next_ns:  # due now: queued for the next tick
                    fresh.discard(chan)  # an older sample still waiting is superseded
                    chan.taken(recv_ns)
                    chan.ready_gen, chan.ready_idx = gen, len(queue)
                    queue.append((chan.subject, payload, recv_ns))
                    self.samples_taken += 1
                    continue
                chan.payload = payload  # not yet due: the tick collects it when it is
                chan.recv_ns = recv_ns
                fresh.add(chan)
                pending = True
            updated.clear()
            if pending:
                self._next_due_ns = 0  # recompute at the next tick
                if self.on_fresh is not None:
                    self.on_fresh(self)
        if model.events:
            self.publish_events(model.drain_events())

    # -- VehicleHandle -----------------------------------------------------
    @property
    def flavour(self) -> str:
        return self.model.flavour

    @property
    def telemetry(self) -> TelemetryModel:
        return self.model

    def subscribe(self, handler: EventHandler) -> Callable[[], None]:
        return self.events.subscribe(handler)

    def may_act(self) -> bool:
        return self.acting()

    def may_record(self) -> bool:
        return self.recording()

    def report_error(self, where: str) -> None:
        """Count an error and log it with its traceback, at most every 10 s per vehicle and place."""
        self.metrics.errors.labels(where=where).inc()
        now = time.monotonic()
        if now - self._error_logged.get(where, -1e9) >= 10.0:
            self._error_logged[where] = now
            log.exception(f"{where}_failed", vehicle=self.vid)

    def publish_event(self, ev: Event, *, payload: bytes | None = None, enqueue: bool = True) -> None:
        """Count the event, enqueue it for JetStream (unless the caller spooled it), tell subscribers.

        An event to enqueue passes the event budget first; held back, it is
        counted (and summarised by `flush_suppressed`) but still reaches the
        subscribers. An event the caller already spooled is durable and is
        never held back. An internal event only reaches the subscribers.
        """
        if ev.internal:
            pass
        elif enqueue and not self.recording():
            pass  # a standby's view of the vehicle: the owner publishes it
        elif enqueue and not self.budget.admit(ev.type, ev.time_ns):
            self.metrics.events_suppressed.labels(type=ev.type).inc()
        else:
            self.metrics.events.labels(type=ev.type).inc()
            if enqueue:
                if payload is None:
                    payload = envelope.pack(self.vid, ev.time_ns, ev.data)
                self.publisher.enqueue_event(event_subject(self.cfg.env, self.vid, ev.type), ev.msg_id, payload)
        if self.events:  # every event, whatever became of it above, reaches the subscribers
            self.events.publish(ev)

    def publish_events(self, events: Iterable[Event]) -> None:
        for ev in events:
            self.publish_event(ev)

    def emit(self, etype: str, **data: Any) -> None:
        """Emit a gateway-side event (link, command results, shadow) with the vehicle snapshot."""
        self.model.emit(etype, self.clock.now_ns(), **data)
        self.publish_events(self.model.drain_events())

    def flush_suppressed(self, now_ns: int, *, flush: bool = False) -> None:
        """One `events_suppressed` per event type whose budget window has ended (all with `flush`)."""
        if flush and self.model.repeats_pending:
            self.flush_repeats(now_ns, flush=True)  # its summaries pass the budget before it is flushed
        for s in self.budget.due(now_ns, flush=flush):
            self.emit(EventType.EVENTS_SUPPRESSED, event_type=s.event_type, count=s.count, window_s=s.window_s)

    def flush_repeats(self, now_ns: int, *, flush: bool = False) -> None:
        """Summaries of the repeated status texts whose collapse window has ended (gateway/twin/telemetry.py)."""
        self.model.flush_repeats(now_ns, flush=flush)
        if self.model.events:
            self.publish_events(self.model.drain_events())

    def on_link_state(self, old: LinkState, new: LinkState) -> None:
        if self.closing:
            return
        now = time.monotonic()
        if new is LinkState.UP:
            if self._was_up and self._lost_at_mono is not None:
                # The outage runs from the last heartbeat before the loss, not from
                # when the timeout noticed it.
                self.emit(EventType.LINK_RESTORED, outage_s=round(now - self._lost_at_mono, 2))
            self._was_up = True
            self._lost_at_mono = None
        elif old is LinkState.UP:
            last_hb = self.session.last_heartbeat_mono
            self._lost_at_mono = last_hb or now
            age = now - last_hb if last_hb else None
            self.emit(EventType.LINK_LOST, heartbeat_age_s=None if age is None else round(age, 2))

    # -- ticker ------------------------------------------------------------
    def link_channel(self) -> dict[str, Any]:
        now = time.monotonic()
        h = self.session.health()
        dt = max(1e-3, now - self._last_link_pub_mono)
        rate = (h.messages_in - self._last_msgs) / dt
        self._last_msgs, self._last_link_pub_mono = h.messages_in, now
        age = h.heartbeat_age_s
        return {
            "state": h.state.value,
            "endpoint": h.endpoint,
            "heartbeat_age_s": None if age is None else round(age, 3),
            "msgs_per_s": round(rate, 1),
            "messages": h.messages_in,
            "crc_errors": h.crc_errors,
            "bad_data": h.bad_data,
            "seq_gaps": h.seq_gaps,
            "connects": h.connects,
            "gateway": self.cfg.instance,
            # Readers take the gateway as gone when this record is much older
            # than its period (docs/commands.md, Staleness).
            "period_s": self._link_period_s,
            **(self.lease_info() if self.lease_info is not None else {}),
            # Two links (`--backup`): which one carries the vehicle now, and where it goes.
            **({"active_link": str(self.dual.active), "active_endpoint": str(self.dual.active_endpoint)}
               if self.dual is not None else {}),
        }

    def collect_due(self, now_ns: int, out: list[StateSample]) -> bool:
        """Append (subject, payload, receive time) for every fresh (rate-limited) channel now due.

        Synchronous and cheap when nothing is due, because the fleet ticker
        calls it on every tick for every vehicle with a sample waiting. Returns
        True while fresh samples remain (they go out on a later tick).
        """
        if now_ns < self._next_due_ns:
            return True
        fresh = self.fresh
        if not self.recording():
            fresh.clear()
            return False
        next_due = 1 << 62
        taken = 0
        for chan in list(fresh):
            due = chan.next_ns
            if now_ns < due:
                next_due = min(next_due, due)
                continue
            fresh.discard(chan)
            taken += 1
            chan.taken(chan.recv_ns)  # the schedule: StateChannel.taken
            out.append((chan.subject, chan.payload, chan.recv_ns))
        self.samples_taken += taken
        self._next_due_ns = next_due if fresh else 0
        return bool(fresh)

    @property
    def superseded(self) -> int:
        """State samples a newer one replaced before their publish turn: the rate decimation of a
        vehicle sending faster than configured, and the state an overloaded gateway sheds."""
        return self.model.samples - self.samples_taken - len(self.fresh) + self.link.codec.stats.superseded

    def collect_link(self, now_ns: int, out: list[StateSample]) -> None:
        """The link channel, every link period even when the vehicle is silent: the gateway's liveness record.

        Appended to `out`, which the fleet's ticker publishes as one buffer with the others'
        (one write per sample was a write per vehicle per second)."""
        if self.model.repeats_pending:
            self.flush_repeats(now_ns)
        if self.budget.holding:
            self.flush_suppressed(now_ns)
        if self._link_subject is not None and self.recording():
            out.append((self._link_subject, self._packer.pack(now_ns, self.link_channel()), now_ns))

    def announce_started(self) -> None:
        self.emit(EventType.GATEWAY_STARTED, gateway=self.cfg.instance, version=_version())

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Supervise the link: a bug that escapes it restarts this vehicle only, after a backoff."""
        if self.announce_on_start:
            self.announce_started()
        backoff = Backoff(initial_s=self.cfg.link.backoff_initial_s, max_s=self.cfg.link.backoff_max_s)
        task_status.started()  # readiness is the daemon's wait on link.wait_ready()
        while True:
            try:
                await self.link.run()
            except Exception:
                self.metrics.errors.labels(where="vehicle").inc()
                log.exception("vehicle_task_crashed_restarting", vehicle=self.vid)
            await anyio.sleep(backoff.next_delay_s())


# The fleet ticker's loops over the twins (gateway/daemon.py `_ticker`), here to be compiled with
# the twins (ops/compile.py) and tested without a running loop. Interpreted, the loop was
# ~6 % of py-spy's samples of a compiled gateway at 1,000 vehicles; compiled, the gateway's CPU a
# message did not change by more than the benchmark resolves (docs/benchmarks.md). Each stops once
# time.perf_counter() passes `end_s`, looked at every `STEP_CHECK_EVERY` twins, and returns the
# index to resume from: the ticker publishes what it has and yields between steps.
STEP_CHECK_EVERY = 16


def collect_fleet_due(batch: list[VehicleTwin], start: int, now_ns: int, out: list[StateSample], *,
                      dirty: set[VehicleTwin], end_s: float) -> int:
    """`collect_due` of each twin from batch[start:] into `out`; a twin with samples still waiting goes back to `dirty`."""
    n = len(batch)
    i = start
    while i < n:
        twin = batch[i]
        i += 1
        try:
            if twin.collect_due(now_ns, out):
                dirty.add(twin)
        except Exception:  # one vehicle's bad state must not stop the others' publishing
            twin.fresh.clear()
            twin.report_error("publish")
        if i % STEP_CHECK_EVERY == 0 and time.perf_counter() >= end_s:
            break
    return i


def collect_fleet_links(twins: list[VehicleTwin], due: list[int], start: int, *, now_ns: int,
                        out: list[StateSample], end_s: float) -> int:
    """`collect_link` of the twins at the indexes due[start:] into `out`."""
    n = len(due)
    i = start
    while i < n:
        twin = twins[due[i]]
        i += 1
        try:
            twin.collect_link(now_ns, out)
        except Exception:
            twin.report_error("publish")
        if i % STEP_CHECK_EVERY == 0 and time.perf_counter() >= end_s:
            break
    return i


def _always() -> bool:
    return True


def _version() -> str:
    from mavjet.contract import __version__

    return __version__
