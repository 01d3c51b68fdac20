"""The uplink estimator and shaping policy, sans-IO: times are passed in."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from mavjet.contract.errors import ConfigError
from mavjet.gateway.publish.uplink import FRAME_OVERHEAD_BYTES, Level, UplinkConfig, UplinkShaper
from mavjet.gateway.publish.uplinkest import LAG_HOPS, UplinkEstimator

S = 1_000_000_000  # ns


def _probe(est: UplinkEstimator, at_ns: int, rtt_s: float, *, counting: bool = True) -> None:
    est.probe_sent(at_ns, counting=counting)
    est.probe_acked(at_ns + int(rtt_s * S))


def test_queue_delay_is_the_round_trip_above_the_base() -> None:
    est = UplinkEstimator()
    _probe(est, 0, 0.15)
    assert est.queue_delay_s() == pytest.approx(0.0)
    _probe(est, 1 * S, 0.95)
    assert est.queue_delay_s() == pytest.approx(0.8)
    est.probe_sent(3 * S, counting=False)  # outstanding for 2 s: at least that much queue
    assert est.queue_delay_s(5 * S) == pytest.approx(1.85)


def test_delivery_rate_from_bytes_written_between_pongs() -> None:
    est = UplinkEstimator()
    _probe(est, 0, 0.2)
    est.sent_bytes += 8000
    _probe(est, 1 * S, 0.2)  # 8000 bytes written before this PING, PONGs 1 s apart
    assert est.capacity_bytes_s == pytest.approx(8000.0)
    est.sent_bytes += 4000
    _probe(est, 2 * S, 0.2)
    assert est.capacity_bytes_s == pytest.approx(8000.0)  # the best rate of the window


def test_bytes_still_in_the_client_buffer_are_before_the_ping() -> None:
    est = UplinkEstimator()
    _probe(est, 0, 0.2)
    est.sent_bytes += 8000
    # The gateway's client queues its PING behind its buffer (OrderedFlushClient): all 8,000 bytes precede
    # it, those still in the buffer too.
    est.probe_sent(1 * S, counting=True)
    est.probe_acked(int(1.2 * S))
    assert est.capacity_bytes_s == pytest.approx(8000.0)


def test_event_loop_lag_is_not_taken_for_a_queue_in_the_link() -> None:
    """A busy gateway's PONG waits for its loop: that lag comes off the round trip, a link's queue does not."""
    busy = UplinkShaper(UplinkConfig())
    _probe(busy.est, 0, 0.01)  # the base round trip of a fast link
    busy.est.note_loop_lag(0.4, int(0.9 * S))
    _probe(busy.est, 1 * S, 0.42)  # 0.4 s of it was the loop
    assert busy.est.queue_delay_s() < 0.05
    assert busy.update(int(1.5 * S)) is Level.NORMAL
    thin = UplinkShaper(UplinkConfig())
    _probe(thin.est, 0, 0.01)
    thin.est.note_loop_lag(0.01, int(0.9 * S))
    _probe(thin.est, 1 * S, 0.7)  # a loop on time, a standing queue in the link
    assert thin.est.queue_delay_s() == pytest.approx(0.7 - LAG_HOPS * 0.01 - 0.01, abs=0.005)
    assert thin.update(int(1.8 * S)) is Level.NEWEST_ONLY


def test_a_saturated_loop_is_not_taken_for_a_queue_in_the_link() -> None:
    """At 99 % CPU a probe waits for the loop at each of its passes (the PING's write, the PONG's read,
    the prober's wake-up), each up to the loop's worst lag: ~3 lags of round trip, none of it the link's."""
    busy = UplinkShaper(UplinkConfig())
    _probe(busy.est, 0, 0.01)
    for i in range(30):  # 3 s of probes, each ~3 passes of a loop 150 ms behind
        busy.est.note_loop_lag(0.15, int((1 + i * 0.1) * S))
        _probe(busy.est, int((1 + i * 0.1) * S), 0.01 + 3 * 0.15)
        busy.update(int((1.05 + i * 0.1) * S))
    assert busy.level is Level.NORMAL
    assert busy.shed == 0


def test_no_rate_from_probes_taken_while_not_counting() -> None:
    est = UplinkEstimator()
    _probe(est, 0, 0.2, counting=False)
    est.sent_bytes += 8000
    _probe(est, 1 * S, 0.2, counting=False)
    assert est.capacity_bytes_s is None


def _samples(n_vehicles: int, t: int) -> list[tuple[str, bytes, int]]:
    return [(f"fleet.t.veh.V{v}.state.{ch}", b"x" * 200, t) for v in range(n_vehicles) for ch in ("position", "att")]


def test_healthy_link_passes_every_sample_untouched() -> None:
    sh = UplinkShaper(UplinkConfig())
    _probe(sh.est, 0, 0.15)
    batch = _samples(3, 1)
    assert sh.admit_states(batch, 1 * S) is batch
    assert sh.level is Level.NORMAL and sh.shed == 0


def test_a_queue_decimates_each_channel_to_one_hz_newest_wins() -> None:
    sh = UplinkShaper(UplinkConfig(target_delay_s=0.3, decimate_hz=1.0))
    _probe(sh.est, 0, 0.15)
    _probe(sh.est, S, 0.65)  # 0.5 s of queue
    sent: list[tuple[str, bytes, int]] = []
    for tick in range(20):  # 2 s of 10 Hz ticks
        now = 2 * S + tick * S // 10
        sent += sh.admit_states(_samples(1, now), now)
    assert sh.level is Level.DECIMATE
    by_subject: dict[str, list[int]] = {}
    for subject, _p, recv in sent:
        by_subject.setdefault(subject, []).append(recv)
    assert set(by_subject) == {"fleet.t.veh.V0.state.position", "fleet.t.veh.V0.state.att"}
    assert all(len(v) == 2 for v in by_subject.values())  # 1 Hz over 2 s
    assert sh.shed == 40 - 4 - 2  # offered, sent, and the newest of each channel still held
    # each one sent was the newest of its channel at the time
    assert all(r == by_subject["fleet.t.veh.V0.state.att"][i] for i, r in enumerate(by_subject["fleet.t.veh.V0.state.position"]))


def test_newest_only_spends_a_byte_budget_longest_waiting_channel_first() -> None:
    cfg = UplinkConfig(target_delay_s=0.3, newest_only_delay_s=1.0, state_share=0.5)
    sh = UplinkShaper(cfg)
    _probe(sh.est, 0, 0.1)
    sh.est.sent_bytes += 8000
    _probe(sh.est, S, 2.0)  # 1.9 s queue; 8000 B over ~2.9 s between PONGs
    cap = sh.est.capacity_bytes_s
    assert cap is not None
    sent_bytes = 0
    for tick in range(100):  # 10 s, 10 vehicles x 2 channels x 10 Hz offered
        now = 4 * S + tick * S // 10
        out = sh.admit_states(_samples(10, now), now)
        sent_bytes += sum(len(p) + FRAME_OVERHEAD_BYTES for _s, p, _r in out)
    assert sh.level is Level.NEWEST_ONLY
    assert sent_bytes <= cap * cfg.state_share * 10 + cap * cfg.state_share + 1000  # the budget, and its burst
    assert sent_bytes > 0


def test_recovers_one_level_at_a_time_after_calm() -> None:
    cfg = UplinkConfig(recover_s=2.0)
    sh = UplinkShaper(cfg)
    _probe(sh.est, 0, 0.1)
    _probe(sh.est, S, 2.0)
    sh.update(4 * S)
    assert sh.level is Level.NEWEST_ONLY
    t = 4 * S
    levels = []
    for _ in range(12):  # calm probes every second
        _probe(sh.est, t, 0.1)
        t += S
        levels.append(sh.update(t))
    assert Level.DECIMATE in levels and levels[-1] is Level.NORMAL
    assert levels.index(Level.NORMAL) > levels.index(Level.DECIMATE)


def test_bulk_waits_for_events_and_a_short_queue_and_chunks_follow_the_rate() -> None:
    pending = [True]
    sh = UplinkShaper(UplinkConfig(bulk_chunk_s=0.5), higher_pending=lambda: pending[0])
    assert sh.bulk_ready(0)  # healthy link: no gate
    sizes = [sh.bulk_chunk_bytes(128 * 1024, 0)]
    for _ in range(5):
        sizes.append(sh.bulk_chunk_bytes(128 * 1024, sizes[-1]))
    assert sizes == [8192, 16384, 32768, 65536, 131072, 131072]  # a slow start up to the default
    _probe(sh.est, 0, 0.1)
    _probe(sh.est, S, 0.6)
    assert sh.update(2 * S) is Level.DECIMATE
    assert sh.bulk_chunk_bytes(128 * 1024, 0) == 8 * 1024  # constrained, rate not measured yet
    assert not sh.bulk_ready(2 * S)  # events waiting and a queue
    pending[0] = False
    assert not sh.bulk_ready(2 * S)  # still a queue
    sh.est.sent_bytes += 8000
    _probe(sh.est, 2 * S, 0.1)
    sh.est.sent_bytes += 8000
    _probe(sh.est, 3 * S, 0.1)
    assert sh.bulk_ready(4 * S)
    # the best rate seen: 8000 B written before the PING at 2 s, PONGs at 1.6 s and 2.1 s
    assert sh.est.capacity_bytes_s == pytest.approx(16000.0)
    assert sh.bulk_chunk_bytes(128 * 1024, 8192) == 8000  # half a second of it


def test_bulk_waits_out_a_disconnect() -> None:
    sh = UplinkShaper(UplinkConfig())
    sh.disconnected()
    assert not sh.bulk_ready(0)  # a chunk sent into an outage only times out
    sh.link_up = True  # the monitor's next PONG
    assert sh.bulk_ready(0)


def test_disabled_never_shapes() -> None:
    sh = UplinkShaper(UplinkConfig(enabled=False))
    _probe(sh.est, 0, 0.1)
    _probe(sh.est, S, 5.0)
    batch = _samples(2, 1)
    assert sh.admit_states(batch, 7 * S) is batch


@pytest.mark.parametrize("kw", [{"target_delay_s": 0}, {"state_share": 1.5}, {"newest_only_delay_s": 0.1},
                                {"bulk_min_chunk_bytes": 10}, {"probe_interval_s": float("nan")},
                                {"newest_only_delay_s": float("nan")}, {"decimate_hz": float("inf")},
                                {"recover_max_s": 1.0}, {"recover_max_s": float("nan")}])
def test_bad_knobs_are_config_errors(kw: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        UplinkConfig(**kw)  # type: ignore[arg-type]


class _Link:
    """A bottleneck in the sans-IO tests: bytes queue and drain at `rate_b_s`; a PING's round trip is the base
    plus the queue ahead of it. Drives one shaper with 10 Hz ticks of a fleet's state and a probe every 0.5 s."""

    def __init__(self, sh: UplinkShaper, *, rate_b_s: float, base_rtt_s: float = 0.05, vehicles: int = 10) -> None:
        self.sh, self.rate_b_s, self.base_rtt_s, self.vehicles = sh, rate_b_s, base_rtt_s, vehicles
        self.queue_b = 0.0
        self.now_ns = 0
        self.ack_at_ns: int | None = None
        self.next_probe_ns = 0
        self.sent = 0
        self.levels: list[Level] = []
        self.hz: list[float] = []
        self.delays_s: list[float] = []  # each PING's round trip above the base: what an event written then waits

    def run(self, seconds: float, *, spike_at_s: float | None = None) -> None:
        tick_ns = S // 10
        for _ in range(int(seconds * 10)):
            self.now_ns += tick_ns
            self.queue_b = max(0.0, self.queue_b - self.rate_b_s * tick_ns / S)
            if self.ack_at_ns is not None and self.ack_at_ns <= self.now_ns:
                self.sh.est.probe_acked(self.ack_at_ns)
                self.sh.update(self.ack_at_ns)
                self.ack_at_ns = None
            if self.ack_at_ns is None and self.now_ns >= self.next_probe_ns:
                self.sh.est.probe_sent(self.now_ns, counting=self.sh.shaping)
                rtt_s = self.base_rtt_s + self.queue_b / self.rate_b_s
                if spike_at_s is not None and self.now_ns >= spike_at_s * S:
                    rtt_s += 0.5  # the gateway's own stall (a metrics scrape, a collection), not the link's
                    spike_at_s = None
                self.delays_s.append(rtt_s - self.base_rtt_s)
                self.ack_at_ns = self.now_ns + int(rtt_s * S)
                self.next_probe_ns = self.now_ns + S // 2
            out = self.sh.admit_states(_samples(self.vehicles, self.now_ns), self.now_ns)
            self.sent += len(out)
            self.queue_b += sum(len(p) + FRAME_OVERHEAD_BYTES for _s, p, _r in out)
            self.levels.append(self.sh.level)
            self.hz.append(self.sh.hz)


def test_a_false_alarm_on_a_fast_link_ends_in_normal() -> None:
    """One probe held up by the gateway itself (here 0.5 s) decimated state. While decimated, the link's
    measured rate is what the shaper lets out, so 'does the full rate fit' never came out yes: a gateway
    on loopback stored ~25 % of its state from then on. Calm steps the rate up (1, 2, 4, 8 Hz, then the
    configured rates) and each step raises the measured rate."""
    cfg = UplinkConfig()
    sh = UplinkShaper(cfg)
    link = _Link(sh, rate_b_s=10e6, base_rtt_s=0.001, vehicles=100)  # 80 Mbit/s, 1 ms
    with capture_logs() as logs:
        link.run(10.0, spike_at_s=5.0)
        assert Level.DECIMATE in link.levels  # the false alarm did decimate
        link.run(60.0)
    assert sh.level is Level.NORMAL
    # Each change is one log line that says why: the queue, then four calm steps tried (2, 4, 8 Hz, NORMAL).
    changes = [(e["level"], e["state_hz"], e["why"]) for e in logs if e["event"] == "uplink_level"]
    assert changes == [("decimate", 1.0, "queue"), ("decimate", 2.0, "trial"), ("decimate", 4.0, "trial"),
                       ("decimate", 8.0, "trial"), ("normal", None, "trial")], changes
    assert logs[0]["queue_delay_s"] >= cfg.target_delay_s
    assert [e["log_level"] for e in logs] == ["warning"] + ["info"] * 4  # shedding warns; stepping up informs
    back = len(link.levels) - link.levels[::-1].index(Level.DECIMATE)  # the tick after the last decimated one
    assert back <= (5.0 + 6 * cfg.recover_s + 2) * 10  # four calm steps and a trial: about half a minute
    assert max(link.delays_s) < 0.6  # the link itself never queued


@pytest.mark.parametrize("vehicles", [10, 4, 2])
def test_on_a_thin_link_state_fills_it_and_failed_steps_back_off(vehicles: int) -> None:
    """64 kbit/s against 2 channels a vehicle of 280 B at 10 Hz (5.6 kB/s a vehicle offered): 2, 4 or 10
    vehicles never fit at full rate. State uses most of the link, what an event would wait behind stays
    bounded, and steps that queue again are tried less and less often. Before the estimator kept its
    capacity from samples taken while state was held back, the newest-only budget (a share of a rate that
    measured only what it let out) shrank round after round: with 10 vehicles 1.35 kB/s got through."""
    sh = UplinkShaper(UplinkConfig())
    link = _Link(sh, rate_b_s=8000.0, base_rtt_s=0.15, vehicles=vehicles)
    link.run(240.0)
    assert sh.level is not Level.NORMAL
    sent_b_s = link.sent * (200 + FRAME_OVERHEAD_BYTES) / 240.0
    assert sent_b_s > 0.6 * link.rate_b_s, sent_b_s
    late = link.delays_s[len(link.delays_s) // 2:]  # the second half
    assert max(late) < 0.6, max(late)
    steps = [(lv, hz) for lv, hz in zip(link.levels, link.hz, strict=True)]
    changes_late = sum(1 for a, b in zip(steps[len(steps) // 2:], steps[len(steps) // 2 + 1:], strict=False) if a != b)
    assert changes_late <= 4, changes_late  # waits of 40, 80, 120 s by then
