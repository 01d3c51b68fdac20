"""The uplink estimator and shaping policy, sans-IO: times are passed in."""

from __future__ import annotations

import pytest

from gateway.contract.errors import ConfigError
from gateway.uplink import (
    FRAME_OVERHEAD_BYTES,
    LAG_HOPS,
    Level,
    UplinkConfig,
    UplinkEstimator,
    UplinkShaper,
)

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
                                {"newest_only_delay_s": float("nan")}, {"decimate_hz": float("inf")}])
def test_bad_knobs_are_config_errors(kw: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        UplinkConfig(**kw)  # type: ignore[arg-type]
