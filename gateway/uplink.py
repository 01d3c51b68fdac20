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
   sample of each channel is held and replaces the older one (latest wins);
3. bulk transfers (log and blob chunks) last: a chunk goes when no event is
   waiting and the queue is short, and is cut to `bulk_chunk_s` of the
   measured rate, so an event never waits long behind one.

The estimator is fed by round trips through the same byte stream (a NATS
PING behind everything written: its PONG measures the queue ahead of it),
the client's pending bytes, and the bytes the shaper lets out (delivery-rate
samples: what was written before a PING arrived by its PONG). The queue
delay is the round trip above the smallest one seen lately. With the link
healthy (level NORMAL) the shaper passes every sample through untouched and
counts nothing: it is off.

`UplinkShaper` is sans-IO (the caller passes the time in); `UplinkMonitor`
is the small async loop that probes a live connection.

Length: about 400 lines: the estimator, the policy and the probe loop share one
model of the byte stream; the policy stays sans-IO and is unit-tested alone.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol

import anyio
from nats.aio.client import Client
from prometheus_client import CollectorRegistry, Counter, Gauge

from gateway.contract.errors import ConfigError
from gateway.samples import StateSample

_BULK_POLL_S = 0.05
_LAG_SAMPLE_S = 0.05  # while a probe is out, the loop's lag is sampled this often
# How often a probe waits for the event loop: the flusher's write of the PING, the read of the PONG, the
# prober's wake-up. With one lag taken off, a saturated gateway (2,000 vehicles on 2 cores, 99 % CPU) still
# read its own lag as a queue in the link, went newest-only, and its budget, set from the rate it managed to
# send, shrank with every round: 1.6 of 48,000 state samples a second stored. With three, 75 %.
LAG_HOPS = 3
FRAME_OVERHEAD_BYTES = 80  # HPUB line and header around a payload: what a sample costs on the wire


@dataclass(frozen=True, slots=True, kw_only=True)
class UplinkConfig:
    """The `[uplink]` table (docs/config.md)."""

    enabled: bool = True  # measure always; shape only while the link is constrained
    probe_interval_s: float = 0.5  # one PING round trip at a time, at most this often
    # queueing above the base round trip that starts decimation: above a cellular link's usual jitter
    target_delay_s: float = 0.2
    newest_only_delay_s: float = 0.6  # queueing that makes state newest-only within its budget
    recover_s: float = 5.0  # calm this long before stepping one level down
    decimate_hz: float = 1.0  # per-channel state rate while decimating
    state_share: float = 0.5  # of the measured rate, what newest-only state may use
    bulk_chunk_s: float = 0.5  # a bulk chunk is cut to this many seconds of the measured rate
    bulk_min_chunk_bytes: int = 1024
    bulk_max_wait_s: float = 30.0  # a held chunk goes after this long anyway: bulk is last, never starved

    def __post_init__(self) -> None:
        for name in ("probe_interval_s", "target_delay_s", "newest_only_delay_s", "recover_s", "decimate_hz",
                     "state_share", "bulk_chunk_s", "bulk_max_wait_s"):
            # nan passes a plain `<= 0` test and would turn the probe loop into a busy loop
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise ConfigError(f"uplink.{name}", f"must be a finite number > 0, got {getattr(self, name)!r}")
        if self.newest_only_delay_s < self.target_delay_s:
            raise ConfigError("uplink.newest_only_delay_s", "must be >= uplink.target_delay_s")
        if not 0 < self.state_share <= 1:
            raise ConfigError("uplink.state_share", "must be in (0, 1]")
        if self.bulk_min_chunk_bytes < 256:
            raise ConfigError("uplink.bulk_min_chunk_bytes", "must be >= 256")


class Level(IntEnum):
    """How hard state is shaped (the `mavjet_uplink_level` gauge)."""

    NORMAL = 0  # configured rates: shaping off
    DECIMATE = 1  # decimate_hz per channel
    NEWEST_ONLY = 2  # decimate_hz and a byte budget; held samples replaced by newer ones


class BulkPacer(Protocol):
    """What a bulk transfer (gateway.blobs.put_chunks) asks before each chunk."""

    def bulk_chunk_bytes(self, default: int, previous: int) -> int:
        """The next chunk's size, given the previous one's (0 for the first)."""

    async def before_bulk(self, nbytes: int) -> None: ...


class WindowedMin:
    """The minimum over the last `window_s`, in buckets (the base round trip: a queue inflates it)."""

    def __init__(self, window_s: float, buckets: int = 10) -> None:
        self._span_ns = int(window_s * 1e9 / buckets)
        self._buckets: deque[tuple[int, float]] = deque(maxlen=buckets)  # (bucket start, min)

    def add(self, value: float, now_ns: int) -> None:
        if self._buckets and now_ns - self._buckets[-1][0] < self._span_ns:
            start, m = self._buckets[-1]
            self._buckets[-1] = (start, min(m, value))
        else:
            self._buckets.append((now_ns, value))

    def value(self) -> float | None:
        return min(m for _, m in self._buckets) if self._buckets else None


class UplinkEstimator:
    """Round trip, queue delay and delivery rate of the uplink."""

    def __init__(self, *, base_window_s: float = 300.0, rate_window_s: float = 10.0, lag_window_s: float = 3.0) -> None:
        self.base_rtt = WindowedMin(base_window_s)
        self._lags = WindowedMin(lag_window_s)  # of negated lags: the worst lag of the window
        self.rtt_s: float | None = None
        self.sent_bytes = 0  # counted while shaping (the shaper's state, bulk chunks)
        self._rate_window_ns = int(rate_window_s * 1e9)
        self._rates: deque[tuple[int, float]] = deque()  # (time, delivery-rate sample B/s)
        self._last_ack: tuple[int, int] | None = None  # (ack time, bytes sent before that probe)
        self._probe: tuple[int, int, bool] | None = None  # (send time, bytes sent before it, counting)

    def probe_sent(self, now_ns: int, *, counting: bool) -> None:
        """A PING went out, behind the client's write buffer (the gateway's client queues its PING
        after what is buffered, gateway/contract/natsconn.py), so every byte counted so far is
        before it and its round trip includes that buffer."""
        before = self.sent_bytes
        if self._last_ack is not None:
            before = max(before, self._last_ack[1])
        self._probe = (now_ns, before, counting)

    def note_loop_lag(self, lag_s: float, now_ns: int) -> None:
        """How late the event loop ran a timer just now (see `loop_lag_s`)."""
        self._lags.add(-lag_s, now_ns)  # a windowed max, kept as the min of negatives

    @property
    def loop_lag_s(self) -> float:
        """The worst event-loop lag of the last seconds.

        A PONG waits for the loop like any callback, and an outstanding probe
        ages while the loop is busy: on a busy gateway with a fast uplink the
        round trip grows by the loop's lag, not by a queue in the link.
        Shaping state then saves nothing (the CPU goes to MAVLink, not to
        publishing) and loses samples (measured at 1,000 vehicles on
        loopback: 60 % of state shed, CPU up from 65 to 78 %). So the lag is
        taken off every round trip before it counts as queueing, once for
        each time the probe waits for the loop (`LAG_HOPS`).
        """
        worst = self._lags.value()
        return -worst if worst is not None else 0.0

    def _link_s(self, elapsed_ns: int) -> float:
        """A probe's time out, less what it waited for the event loop (`loop_lag_s`)."""
        return max(0.0, elapsed_ns / 1e9 - LAG_HOPS * self.loop_lag_s)

    def probe_acked(self, now_ns: int) -> None:
        if self._probe is None:
            return
        t_send, bytes_before, counting = self._probe
        self._probe = None
        rtt = self._link_s(now_ns - t_send)
        self.rtt_s = rtt
        self.base_rtt.add(rtt, now_ns)
        last, self._last_ack = self._last_ack, (now_ns, bytes_before) if counting else None
        # Everything written before the PING had arrived by the PONG: bytes over
        # the interval between two PONGs is a delivery rate, the link's capacity
        # when a queue stood all along and a lower bound of it otherwise.
        if last is not None and counting and now_ns > last[0]:
            rate = (bytes_before - last[1]) / ((now_ns - last[0]) / 1e9)
            if rate > 0:
                self._rates.append((now_ns, rate))
        while self._rates and now_ns - self._rates[0][0] > self._rate_window_ns:
            self._rates.popleft()

    def probe_lost(self) -> None:
        """The connection went away: the probe will never come back, and the rate series restarts."""
        self._probe = None
        self._last_ack = None

    def queue_delay_s(self, now_ns: int | None = None) -> float:
        """The round trip above the base; an outstanding probe older than that counts as its lower bound."""
        base = self.base_rtt.value() or 0.0
        rtt = self.rtt_s or 0.0
        if now_ns is not None and self._probe is not None:
            rtt = max(rtt, self._link_s(now_ns - self._probe[0]))
        return max(0.0, rtt - base)

    @property
    def capacity_bytes_s(self) -> float | None:
        """The best delivery rate seen lately (None until the link has been busy while measured)."""
        return max(r for _, r in self._rates) if self._rates else None


class UplinkMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.level = Gauge("mavjet_uplink_level", "State shaping: 0 off, 1 decimated, 2 newest-only", registry=r)
        self.queue_delay = Gauge("mavjet_uplink_queue_delay_seconds", "Uplink queueing delay (PING round trip "
                                 "above the base)", registry=r)
        self.capacity = Gauge("mavjet_uplink_capacity_bytes_per_second", "Measured uplink delivery rate "
                              "(0: not measured)", registry=r)
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
        self.est = UplinkEstimator()
        self.level = Level.NORMAL
        self.higher_pending = higher_pending
        self.metrics = metrics
        self.shed = 0
        self.link_up = True
        self._interval_ns = int(1e9 / cfg.decimate_hz)
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
        cap = self.est.capacity_bytes_s
        up = Level.NEWEST_ONLY if delay >= cfg.newest_only_delay_s else Level.DECIMATE if delay >= cfg.target_delay_s \
            else Level.NORMAL
        if up > self.level:
            self._set(up)
            self._calm_since_ns = None
        elif delay < cfg.target_delay_s / 2 and self.level is not Level.NORMAL:
            if self._calm_since_ns is None:
                self._calm_since_ns = now_ns
            elif now_ns - self._calm_since_ns >= cfg.recover_s * 1e9 and self._fits_one_level_down(now_ns):
                self._set(Level(self.level - 1))
                self._calm_since_ns = now_ns
        elif delay >= cfg.target_delay_s / 2:
            self._calm_since_ns = None
        if self.metrics is not None:
            self.metrics.queue_delay.set(delay)
            self.metrics.capacity.set(cap or 0.0)
        return self.level

    def _fits_one_level_down(self, now_ns: int) -> bool:
        """A level down must not just fill the queue again (no flapping between levels)."""
        if self.level is Level.NEWEST_ONLY:  # the budget held nothing back lately: decimation alone fits
            return now_ns - self._budget_limited_ns >= self.cfg.recover_s * 1e9
        cap = self.est.capacity_bytes_s
        # Decimated, the full rate is unknown; what was offered at it is (the batches still arrive in full).
        return cap is None or self._offered <= cap * self.cfg.state_share

    def _set(self, level: Level) -> None:
        self.level = level
        if self.metrics is not None:
            self.metrics.level.set(int(level))

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
        for subject in due:
            sample = held[subject]
            if level is Level.NEWEST_ONLY and not self._take_budget(len(sample[1]) + FRAME_OVERHEAD_BYTES, now_ns):
                self._budget_limited_ns = now_ns
                break
            del held[subject]
            out.append(sample)
            self._next_ns[subject] = now_ns + self._interval_ns
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
