"""The uplink's estimator: round trip, queue delay and delivery rate of the NATS connection (sans-IO).

Fed by `mavjet.gateway.publish.uplink.UplinkMonitor`'s probes (a NATS PING behind everything
written; its PONG measures the queue ahead of it) and by the bytes the shaper
lets out; read by `mavjet.gateway.publish.uplink.UplinkShaper`'s policy.
"""

from __future__ import annotations

import statistics
from collections import deque

# How often a probe waits for the event loop: the flusher's write of the PING, the read of the PONG, the
# prober's wake-up. With one lag taken off, a saturated gateway (2,000 vehicles on 2 cores, 99 % CPU) still
# read its own lag as a queue in the link, went newest-only, and its budget, set from the rate it managed to
# send, shrank with every round: 1.6 of 48,000 state samples a second stored. With three, 75 %.
LAG_HOPS = 3


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

    def __init__(self, *, base_window_s: float = 300.0, rate_window_s: float = 10.0, lag_window_s: float = 3.0,
                 busy_delay_s: float = 0.1) -> None:
        self.base_rtt = WindowedMin(base_window_s)
        self.busy_delay_s = busy_delay_s  # a probe queued at least this long: the link was the bottleneck
        self._lags = WindowedMin(lag_window_s)  # of negated lags: the worst lag of the window
        self.rtt_s: float | None = None
        self.sent_bytes = 0  # counted while shaping (the shaper's state, bulk chunks)
        self._rate_window_ns = int(rate_window_s * 1e9)
        self._rates: deque[tuple[int, float, bool]] = deque()  # (time, delivery-rate sample B/s, link busy)
        self._capacity: float | None = None  # see capacity_bytes_s
        self._last_ack: tuple[int, int] | None = None  # (ack time, bytes sent before that probe)
        self._probe: tuple[int, int, bool] | None = None  # (send time, bytes sent before it, counting)

    def probe_sent(self, now_ns: int, *, counting: bool) -> None:
        """A PING went out, behind the client's write buffer (the gateway's client queues its PING
        after what is buffered, contract/natsconn.py), so every byte counted so far is
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
        busy = rtt - (self.base_rtt.value() or 0.0) >= self.busy_delay_s
        last, self._last_ack = self._last_ack, (now_ns, bytes_before) if counting else None
        # Everything written before the PING had arrived by the PONG: bytes over
        # the interval between two PONGs is a delivery rate, the link's capacity
        # when a queue stood all along and a lower bound of it otherwise.
        if last is not None and counting and now_ns > last[0]:
            rate = (bytes_before - last[1]) / ((now_ns - last[0]) / 1e9)
            if rate > 0:
                self._rates.append((now_ns, rate, busy))
        while self._rates and now_ns - self._rates[0][0] > self._rate_window_ns:
            self._rates.popleft()
        # Medians, not the best: two PONGs bunched by the downlink (acks, commands) make one sample too
        # high, and a best-of read the 64 kbit/s link as ~9.2 kB/s (15 % over).
        busy_rates = [r for _, r, b in self._rates if b]
        if busy_rates:  # the link was the bottleneck: its rate, up or down
            self._capacity = statistics.median_high(busy_rates)
        elif self._rates:  # no queue stood: the link carries at least this much
            floor = statistics.median_high([r for _, r, _ in self._rates])
            self._capacity = floor if self._capacity is None else max(self._capacity, floor)

    def probe_lost(self) -> None:
        """The connection went away: the probe will never come back, and the rate series restarts."""
        self._probe = None
        self._last_ack = None
        self._capacity = None  # a new connection may take another route

    def queue_delay_s(self, now_ns: int | None = None) -> float:
        """The round trip above the base; an outstanding probe older than that counts as its lower bound."""
        base = self.base_rtt.value() or 0.0
        rtt = self.rtt_s or 0.0
        if now_ns is not None and self._probe is not None:
            rtt = max(rtt, self._link_s(now_ns - self._probe[0]))
        return max(0.0, rtt - base)

    @property
    def capacity_bytes_s(self) -> float | None:
        """The link's delivery rate (None until one is measured).

        While a queue stood in the last window (a probe queued `busy_delay_s`),
        the link was the bottleneck: the median of those samples is its rate,
        and it may fall as the link slows. A sample taken with no queue says only
        that the link carries at least that much (BBR's "application-limited"
        samples): it may raise the estimate, never lower it. While the shaper
        holds state back every sample is of that kind, and it measures what
        was let out, not the link: when such samples could lower it, a
        newest-only budget (a share of the rate) shrank round after round.
        """
        return self._capacity
