"""Link-adaptive shaping: measure the NATS uplink and spend it by priority.

A thin uplink (tens of kbit/s, cellular or satellite) is one TCP byte stream:
whatever the gateway writes first arrives first, so a failsafe event written
behind a megabyte of state or a log chunk waits for all of it. Priority can
only be kept by not writing the low classes faster than the link drains.
In order of worth:

1. command results and safety events, then the other events and command
   intake: never decimated, never held (the spool publishes them in order);
2. state, decimated per channel as the link tightens: the configured rates
   (10 Hz) while it is healthy, `decimate_hz` (1 Hz) when the queue builds,
   newest-only within a byte budget when even that does not fit. The newest
   sample of each channel is held and replaces the older one (latest wins).
   Calm steps the rate back up (1, 2, 4, 8 Hz, then the configured rates),
   since while state is held back the link's spare capacity cannot be
   measured, only tried; a step that builds a queue again is undone, and the
   next try waits twice as long;
3. bulk transfers (log and blob chunks) last: a chunk goes when no event is
   waiting and the queue is short, and is cut to `bulk_chunk_s` of the
   measured rate, so an event never waits long behind one.

The estimator (`mavjet.gateway.publish.uplinkest`) is fed by round trips through the same
byte stream (a NATS PING behind everything written: its PONG measures the
queue ahead of it) and the bytes the shaper lets out. With the link healthy
(level NORMAL) the shaper passes every sample through untouched and counts
nothing: it is off.

`UplinkShaper` is sans-IO (the caller passes the time in); `UplinkMonitor`
is the small async loop that probes a live connection.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import Protocol

import anyio
import structlog
from nats.aio.client import Client
from prometheus_client import CollectorRegistry, Counter, Gauge

from mavjet.contract.errors import ConfigError
from mavjet.gateway.publish.uplinkest import UplinkEstimator
from mavjet.gateway.twin.samples import StateSample

log = structlog.get_logger("mavjet.uplink")

_BULK_POLL_S = 0.05
_LAG_SAMPLE_S = 0.05  # while a probe is out, the loop's lag is sampled this often
FRAME_OVERHEAD_BYTES = 80  # HPUB line and header around a payload: what a sample costs on the wire
LADDER_STEPS = 3  # decimate_hz doubled this many times (1 -> 2 -> 4 -> 8 Hz), then the configured rates


@dataclass(frozen=True, slots=True, kw_only=True)
class UplinkConfig:
    """The `[uplink]` table (docs/config.md)."""

    enabled: bool = True  # measure always; shape only while the link is constrained
    probe_interval_s: float = 0.5  # one PING round trip at a time, at most this often
    # queueing above the base round trip that starts decimation: above a cellular link's usual jitter
    target_delay_s: float = 0.2
    newest_only_delay_s: float = 0.6  # queueing that makes state newest-only within its budget
    recover_s: float = 5.0  # calm this long before stepping one level (or rate) down
    recover_max_s: float = 120.0  # a step that queued again doubles the wait for the next, up to this
    decimate_hz: float = 1.0  # per-channel state rate while decimating
    state_share: float = 0.5  # of the measured rate, what newest-only state may use
    bulk_chunk_s: float = 0.25  # a bulk chunk is cut to this many seconds of the measured rate
    bulk_min_chunk_bytes: int = 1024
    bulk_max_wait_s: float = 30.0  # a held chunk goes after this long anyway: bulk is last, never starved

    def __post_init__(self) -> None:
        for name in ("probe_interval_s", "target_delay_s", "newest_only_delay_s", "recover_s", "recover_max_s",
                     "decimate_hz", "state_share", "bulk_chunk_s", "bulk_max_wait_s"):
            # nan passes a plain `<= 0` test and would turn the probe loop into a busy loop
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise ConfigError(f"uplink.{name}", f"must be a finite number > 0, got {getattr(self, name)!r}")
        if self.newest_only_delay_s < self.target_delay_s:
            raise ConfigError("uplink.newest_only_delay_s", "must be >= uplink.target_delay_s")
        if self.recover_max_s < self.recover_s:
            raise ConfigError("uplink.recover_max_s", "must be >= uplink.recover_s")
        if not 0 < self.state_share <= 1:
            raise ConfigError("uplink.state_share", "must be in (0, 1]")
        if self.bulk_min_chunk_bytes < 256:
            raise ConfigError("uplink.bulk_min_chunk_bytes", "must be >= 256")


class Level(IntEnum):
    """How hard state is shaped (the `mavjet_uplink_level` gauge)."""

    NORMAL = 0  # configured rates: shaping off
    DECIMATE = 1  # decimate_hz per channel
    NEWEST_ONLY = 2  # decimate_hz and a byte budget; held samples replaced by newer ones


class Why(StrEnum):
    """Why the shaper changed level or rate (the `uplink_level` log line)."""

    QUEUE = "queue"  # the uplink's queue passed target_delay_s or newest_only_delay_s
    FITS = "fits"  # calm, and the step down is known to fit
    TRIAL = "trial"  # calm, and the step down is tried
    TRIAL_FAILED = "trial_failed"  # the queue built again within recover_s: the step is undone


class BulkPacer(Protocol):
    """What a bulk transfer (mavjet.gateway.stores.chunks.put_chunks) asks before each chunk."""

    def bulk_chunk_bytes(self, default: int, previous: int) -> int:
        """The next chunk's size, given the previous one's (0 for the first)."""

    async def before_bulk(self, nbytes: int) -> None: ...


class UplinkMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.level = Gauge("mavjet_uplink_level", "State shaping: 0 off, 1 decimated, 2 newest-only", registry=r)
        self.queue_delay = Gauge("mavjet_uplink_queue_delay_seconds", "Uplink queueing delay (PING round trip "
                                 "above the base)", registry=r)
        self.capacity = Gauge("mavjet_uplink_capacity_bytes_per_second", "Measured uplink delivery rate "
                              "(0: not measured)", registry=r)
        self.state_hz = Gauge("mavjet_uplink_state_hz", "Per-channel state rate while shaping (0: not shaping, "
                              "every configured sample goes)", registry=r)
        self.shed = Counter("mavjet_uplink_shed", "State samples not sent because a newer one replaced them "
                            "while the uplink was constrained", ["level"], registry=r)
        self.bulk_held = Counter("mavjet_uplink_bulk_held_seconds", "Time bulk chunks waited for higher "
                                 "priorities", registry=r)
        self._shed = {lv: self.shed.labels(lv.name.lower()) for lv in (Level.DECIMATE, Level.NEWEST_ONLY)}

    def shed_at(self, level: Level, n: int) -> None:
        self._shed[level].inc(n)


class UplinkShaper:
    """The policy: a level from the estimator, state admitted per channel, bulk gated. Sans-IO."""

    def __init__(self, cfg: UplinkConfig, *, higher_pending: Callable[[], bool] = lambda: False,
                 metrics: UplinkMetrics | None = None) -> None:
        self.cfg = cfg
        # a probe queued half the target: the link was busy, and the rate measured then is its capacity
        self.est = UplinkEstimator(busy_delay_s=cfg.target_delay_s / 2)
        self.level = Level.NORMAL
        self.higher_pending = higher_pending
        self.metrics = metrics
        self.shed = 0
        self.link_up = True
        self.queue_delay_s = 0.0  # as of the last update()
        self.hz = cfg.decimate_hz  # per channel, while shaping: decimate_hz, doubled on each calm step
        self._wait_s = cfg.recover_s  # calm needed before the next step down
        self._trial: tuple[int, Level, float] | None = None  # a step down on trial: (when, level and hz before)
        self._held: dict[str, StateSample] = {}
        self._next_ns: dict[str, int] = {}  # per subject: earliest next send
        self._last_sent_ns: dict[str, int] = {}
        self._calm_since_ns: int | None = None
        self._budget_limited_ns = 0  # last time the byte budget held a sample back
        self._tokens = 0.0
        self._tokens_at_ns = 0
        self._offered = 0.0  # EWMA of state bytes/s offered while shaping
        self._offered_at_ns = 0

    @property
    def shaping(self) -> bool:
        return self.level is not Level.NORMAL

    # -- the level -----------------------------------------------------------
    def update(self, now_ns: int) -> Level:
        """Re-evaluate the level (after each probe, and on each state batch)."""
        if not self.cfg.enabled:
            return self.level
        cfg, delay = self.cfg, self.est.queue_delay_s(now_ns)
        self.queue_delay_s = delay
        cap = self.est.capacity_bytes_s
        up = Level.NEWEST_ONLY if delay >= cfg.newest_only_delay_s else Level.DECIMATE if delay >= cfg.target_delay_s \
            else Level.NORMAL
        if self._trial is not None:
            at, level, hz = self._trial
            if up is not Level.NORMAL:  # the step queued again: undo it, try again later
                self._trial = None
                self._wait_s = min(cfg.recover_max_s, 2 * self._wait_s)
                self._set(max(self.level, level), hz, Why.TRIAL_FAILED)
                self._calm_since_ns = None
            elif now_ns - at >= cfg.recover_s * 1e9:  # it held
                self._trial = None
                self._wait_s = cfg.recover_s
        if up > self.level:
            self._set(up, cfg.decimate_hz, Why.QUEUE)
            self._calm_since_ns = None
        elif delay < cfg.target_delay_s / 2 and self.level is not Level.NORMAL:
            if self._calm_since_ns is None:
                self._calm_since_ns = now_ns
            elif now_ns - self._calm_since_ns >= self._wait_s * 1e9:
                self._step_down(now_ns)
                self._calm_since_ns = now_ns
        elif delay >= cfg.target_delay_s / 2:
            self._calm_since_ns = None
        if self.metrics is not None:
            self.metrics.queue_delay.set(delay)
            self.metrics.capacity.set(cap or 0.0)
        return self.level

    def _step_down(self, now_ns: int) -> None:
        """One level or one rate step down: known to fit, or on trial (undone if the queue builds again)."""
        cfg = self.cfg
        if self.level is Level.NEWEST_ONLY:
            # The budget held nothing back lately: decimation alone fits. Else it is tried, as below.
            fits = now_ns - self._budget_limited_ns >= cfg.recover_s * 1e9
            if not fits:
                self._trial = (now_ns, self.level, self.hz)
            self._set(Level.DECIMATE, cfg.decimate_hz, Why.FITS if fits else Why.TRIAL)
            return
        cap = self.est.capacity_bytes_s
        # Decimated, the full rate is unknown; what was offered at it is (the batches still arrive in full).
        if cap is None or self._offered <= cap * cfg.state_share:
            self._set(Level.NORMAL, cfg.decimate_hz, Why.FITS)
            return
        # Held back, the link's spare capacity does not show in the rate measured (only what was let out
        # does): a step up is the only way to learn it. On trial: a queue within recover_s undoes it.
        self._trial = (now_ns, self.level, self.hz)
        if self.hz >= cfg.decimate_hz * 2 ** LADDER_STEPS:
            self._set(Level.NORMAL, cfg.decimate_hz, Why.TRIAL)
        else:
            self._set(self.level, 2 * self.hz, Why.TRIAL)

    def _set(self, level: Level, hz: float, why: Why) -> None:
        changed = (level, hz) != (self.level, self.hz)
        self.level, self.hz = level, hz
        if self.metrics is not None:
            self.metrics.level.set(int(level))
            self.metrics.state_hz.set(0.0 if level is Level.NORMAL else hz)
        if changed:  # rare (each trial that fails doubles the wait for the next): what an operator asks first
            # Shedding state is a warning (the fleet's twins go coarser), stepping back up is news.
            emit = log.warning if why in (Why.QUEUE, Why.TRIAL_FAILED) else log.info
            emit("uplink_level", level=level.name.lower(), state_hz=None if level is Level.NORMAL else hz,
                 why=why.value, queue_delay_s=round(self.queue_delay_s, 3),
                 loop_lag_s=round(self.est.loop_lag_s, 3), capacity_bytes_s=self.est.capacity_bytes_s)

    # -- state ---------------------------------------------------------------
    def admit_states(self, batch: list[StateSample], now_ns: int) -> list[StateSample]:
        """What of a tick's state batch goes out now; the rest is held (newest per channel) or replaced."""
        level = self.update(now_ns)
        if level is Level.NORMAL:
            if self._held:  # back to healthy: what was held is the newest of its channel
                batch = list(self._held.values()) + batch
                self._held.clear()
            return batch
        self._count_offered(batch, now_ns)
        held, shed = self._held, 0
        for sample in batch:
            if sample[0] in held:
                shed += 1
            held[sample[0]] = sample
        if shed:
            self.shed += shed
            if self.metrics is not None:
                self.metrics.shed_at(level, shed)
        due = [s for s in held if self._next_ns.get(s, 0) <= now_ns]
        if level is Level.NEWEST_ONLY:
            due.sort(key=lambda s: self._last_sent_ns.get(s, 0))  # the longest-waiting channel first
        out: list[StateSample] = []
        interval_ns = int(1e9 / self.hz)
        for subject in due:
            sample = held[subject]
            if level is Level.NEWEST_ONLY and not self._take_budget(len(sample[1]) + FRAME_OVERHEAD_BYTES, now_ns):
                self._budget_limited_ns = now_ns
                break
            del held[subject]
            out.append(sample)
            self._next_ns[subject] = now_ns + interval_ns
            self._last_sent_ns[subject] = now_ns
            self.est.sent_bytes += len(sample[1]) + FRAME_OVERHEAD_BYTES
        return out

    def _count_offered(self, batch: list[StateSample], now_ns: int) -> None:
        n = sum(len(p) + FRAME_OVERHEAD_BYTES for _, p, _ in batch)
        dt = (now_ns - self._offered_at_ns) / 1e9 if self._offered_at_ns else 0.0
        self._offered_at_ns = now_ns
        if 0 < dt < 5.0:
            a = min(1.0, dt / 5.0)  # ~5 s average
            self._offered = (1 - a) * self._offered + a * (n / dt)

    def _take_budget(self, n: int, now_ns: int) -> bool:
        rate = self.cfg.state_share * (self.est.capacity_bytes_s or 1000.0)
        burst = max(rate, float(n))
        if self._tokens_at_ns:
            self._tokens = min(burst, self._tokens + (now_ns - self._tokens_at_ns) / 1e9 * rate)
        else:
            self._tokens = burst
        self._tokens_at_ns = now_ns
        if self._tokens < n:
            return False
        self._tokens -= n
        return True

    def disconnected(self) -> None:
        """State is dropped while away; what was held is stale by the time the link is back."""
        self.link_up = False
        self._held.clear()
        self.est.probe_lost()

    # -- bulk ----------------------------------------------------------------
    def bulk_ready(self, now_ns: int) -> bool:
        """A bulk chunk may go: the link is healthy, or no event waits and the queue is short."""
        if not self.link_up:  # a chunk sent into an outage only times out
            return False
        if self.update(now_ns) is Level.NORMAL:
            return True
        return not self.higher_pending() and self.est.queue_delay_s(now_ns) < self.cfg.target_delay_s

    def bulk_chunk_bytes(self, default: int, previous: int) -> int:
        """Chunks of `bulk_chunk_s` of the measured rate while shaping; else a slow start.

        An unmeasured link may be thin: one default chunk (128 KiB) would hold
        it for 16 s at 64 kbit/s. So a transfer starts at 8 KiB and doubles per
        chunk while the link stays healthy, a few round trips on a fast one.
        """
        cfg = self.cfg
        cap = self.est.capacity_bytes_s
        if self.shaping:
            size = int(cap * cfg.bulk_chunk_s) if cap is not None else 8 * cfg.bulk_min_chunk_bytes
        else:
            size = 2 * previous if previous else 8 * cfg.bulk_min_chunk_bytes
        return max(cfg.bulk_min_chunk_bytes, min(default, size))


class UplinkMonitor(UplinkShaper):
    """The shaper with its probe loop on a live nats-py connection, and the async bulk gate."""

    async def run(self, connection: Callable[[], Client | None]) -> None:
        """Probe forever: one PING at a time through the connection's write queue."""
        cfg = self.cfg
        while True:
            nc = connection()
            if nc is None or not nc.is_connected:
                self.disconnected()
                await anyio.sleep(cfg.probe_interval_s)
                continue
            t0 = time.monotonic_ns()
            self.est.probe_sent(t0, counting=self.shaping)
            acked_ns = await self._ping(nc)
            if acked_ns is not None:
                self.link_up = True
                self.est.probe_acked(acked_ns)
            else:  # timeout, disconnect: the next round starts over
                self.est.probe_lost()
            self.update(time.monotonic_ns())
            await anyio.sleep(max(0.0, cfg.probe_interval_s - (time.monotonic_ns() - t0) / 1e9))

    async def _ping(self, nc: Client) -> int | None:
        """flush(): a PING behind everything in the socket, and when its PONG came (None: lost).
        A long wait is the measurement itself (queue_delay_s counts it while out); a disconnect
        ends it, since nats-py forgets the PONG it was owed."""
        acked_ns: int | None = None
        async with anyio.create_task_group() as tg:
            async def ping() -> None:
                nonlocal acked_ns
                try:
                    await nc.flush(timeout=60)
                    acked_ns = time.monotonic_ns()  # here, not after the group's exit: one loop pass less
                except Exception:  # a lost probe is a result: acked_ns stays None
                    acked_ns = None
                tg.cancel_scope.cancel()

            tg.start_soon(ping)
            while nc.is_connected:
                t = time.monotonic_ns()
                await anyio.sleep(_LAG_SAMPLE_S)
                now = time.monotonic_ns()  # how late the timer ran: the loop's lag while the probe is out
                self.est.note_loop_lag(max(0.0, (now - t) / 1e9 - _LAG_SAMPLE_S), now)
            tg.cancel_scope.cancel()
        return acked_ns

    async def before_bulk(self, nbytes: int) -> None:
        """Wait for the bulk's turn (bounded by bulk_max_wait_s), then count the chunk."""
        t0 = time.monotonic()
        for _ in range(int(self.cfg.bulk_max_wait_s / _BULK_POLL_S)):  # readiness is computed: polled
            if self.bulk_ready(time.monotonic_ns()):
                break
            await anyio.sleep(_BULK_POLL_S)
        if self.metrics is not None:
            self.metrics.bulk_held.inc(time.monotonic() - t0)
        if self.shaping:
            self.est.sent_bytes += nbytes + FRAME_OVERHEAD_BYTES
