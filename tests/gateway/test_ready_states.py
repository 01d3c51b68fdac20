"""Samples due on arrival are queued for the next tick, one per channel, newest in place; the rest wait in the twin."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from drivers.mavlink.transport import Endpoint
from gateway.clock import GatewayClock
from gateway.config import DEFAULT_RATES_HZ, GatewayConfig, VehicleConfig
from gateway.contract import envelope
from gateway.metrics import GatewayMetrics
from gateway.publisher import Publisher
from gateway.samples import ReadyStates
from gateway.spool import Spool
from gateway.vehicle import VehicleTwin

T0_NS = 1_763_939_000_000_000_000
MS = 1_000_000


class _Clock(GatewayClock):
    def __init__(self) -> None:
        super().__init__()
        self.t_ns = T0_NS

    def now_ns(self) -> int:
        return self.t_ns


@pytest.fixture
def spool(tmp_path: Path) -> Iterator[Spool]:
    s = Spool(tmp_path / "spool.sqlite", max_entries=10)
    yield s
    s.close()


def _twin(tmp_path: Path, spool: Spool, ready: ReadyStates, clock: _Clock) -> VehicleTwin:
    vcfg = VehicleConfig(vid="V1", endpoint=Endpoint.parse("tcp:127.0.0.1:1"))
    cfg = GatewayConfig(vehicles=(vcfg,), env="test", state_dir=tmp_path / "state",
                        rates_hz=dict(DEFAULT_RATES_HZ, attitude=10.0))
    metrics = GatewayMetrics()
    pub = Publisher(cfg, spool, metrics)
    return VehicleTwin(vcfg, cfg, pub, metrics, ready=ready, clock=clock)


def _sample(twin: VehicleTwin, clock: _Clock, at_ms: int, channel: str, i: int) -> None:
    clock.t_ns = T0_NS + at_ms * MS
    twin.model._set(channel, clock.t_ns, {"i": i})
    twin.on_messages([], 0)


def _channels(items: list[tuple[str, bytes, int]]) -> list[tuple[str, int]]:
    return [(subject.rsplit(".", 1)[1], envelope.unpack(payload).data["i"]) for subject, payload, _ in items]


def _superseded(twin: VehicleTwin) -> int:
    return twin.model.samples - twin.samples_taken - len(twin.fresh)


async def test_due_samples_queue_in_arrival_order_one_per_channel_newest_in_place(tmp_path: Path, spool: Spool) -> None:
    ready, clock = ReadyStates(), _Clock()
    twin = _twin(tmp_path, spool, ready, clock)
    _sample(twin, clock, 0, "attitude", 1)
    _sample(twin, clock, 10, "gps", 1)
    _sample(twin, clock, 15, "attitude", 2)  # replaces attitude 1 where it stands: before gps
    assert _channels(ready.items) == [("attitude", 2), ("gps", 1)]
    assert not twin.fresh and _superseded(twin) == 1
    assert _channels(ready.take()) == [("attitude", 2), ("gps", 1)] and ready.items == []

    # The bucket starts full (GCRA, gateway/samples.py): 3 is due at once, and attitude's next
    # slot is then one interval after the first's, at 100 - 50 (the tolerance) = 50 ms.
    _sample(twin, clock, 20, "attitude", 3)
    assert _channels(ready.take()) == [("attitude", 3)]
    _sample(twin, clock, 40, "attitude", 4)
    assert ready.items == [] and len(twin.fresh) == 1
    out: list[tuple[str, bytes, int]] = []
    assert twin.collect_due(T0_NS + 45 * MS, out) is True and out == []
    # Due at 50 ms: 5 arrives then and goes straight to the queue; 4 is superseded, never published.
    _sample(twin, clock, 50, "attitude", 5)
    assert _channels(ready.items) == [("attitude", 5)] and not twin.fresh
    assert twin.collect_due(T0_NS + 50 * MS, out) is False and out == []
    assert _superseded(twin) == 2


async def test_a_waiting_sample_goes_out_through_collect_due_with_its_own_receive_time(tmp_path: Path, spool: Spool) -> None:
    ready, clock = ReadyStates(), _Clock()
    twin = _twin(tmp_path, spool, ready, clock)
    _sample(twin, clock, 0, "attitude", 1)
    ready.take()
    _sample(twin, clock, 25, "attitude", 2)  # due at once: the bucket's second sample
    ready.take()
    _sample(twin, clock, 30, "attitude", 3)  # not due before 50 ms
    out: list[tuple[str, bytes, int]] = []
    assert twin.collect_due(T0_NS + 49 * MS, out) is True and out == []
    assert twin.collect_due(T0_NS + 50 * MS, out) is False
    assert _channels(out) == [("attitude", 3)] and out[0][2] == T0_NS + 30 * MS
    assert _superseded(twin) == 0 and not twin.fresh and ready.items == []
    # The schedule goes on from the slot, not from the late publish: the next one is due at 150 ms.
    _sample(twin, clock, 149, "attitude", 4)
    _sample(twin, clock, 150, "attitude", 5)
    assert _channels(ready.items) == [("attitude", 5)] and _superseded(twin) == 1


def _run(twin: VehicleTwin, ready: ReadyStates, clock: _Clock, arrivals_ms: list[int],
         tick_ms: int = 20) -> tuple[int, int]:
    """Arrivals of attitude samples between publish ticks: (samples published, samples that waited for their slot)."""
    published = waited = 0
    tick = 0
    out: list[tuple[str, bytes, int]] = []
    for i, at in enumerate(arrivals_ms):
        while tick <= at:  # the ticks before this arrival
            out.clear()
            twin.collect_due(T0_NS + tick * MS, out)
            published += len(out) + len(ready.take())
            tick += tick_ms
        _sample(twin, clock, at, "attitude", i)
        waited += len(twin.fresh)
    out.clear()
    twin.collect_due(T0_NS + (tick + 1000) * MS, out)  # a last tick, well after the last arrival
    return published + len(out) + len(ready.take()), waited


async def test_a_vehicle_at_the_configured_rate_is_never_held_however_its_samples_jitter(
        tmp_path: Path, spool: Spool) -> None:
    # 10 Hz, each sample 0-45 ms late; one 80 ms late, and one 140 ms late (a stalled read), which
    # arrives with the next. Under the rule before (the slot half an interval after a late
    # sample, for good), most samples after the first stall waited for their slot.
    ready, clock = ReadyStates(), _Clock()
    twin = _twin(tmp_path, spool, ready, clock)
    lateness = [0, 30, 5, 45, 10, 25]
    arrivals = [k * 100 + lateness[k % len(lateness)] for k in range(60)]
    arrivals[20] = 2080
    arrivals[40] = arrivals[41] = 4140
    published, waited = _run(twin, ready, clock, arrivals)
    assert waited == 0
    assert published == 59  # 40 and 41 in one tick: 41 took 40's place in the queue


async def test_a_vehicle_sending_faster_is_held_to_the_configured_rate(tmp_path: Path, spool: Spool) -> None:
    ready, clock = ReadyStates(), _Clock()
    twin = _twin(tmp_path, spool, ready, clock)
    arrivals = [k * 20 + (7 * k) % 13 for k in range(500)]  # 50 Hz for 10 s, against 10 Hz configured
    published, waited = _run(twin, ready, clock, arrivals)
    # 10 s at 10 Hz; at most one more for the first sample, one for the bucket's tolerance
    # (1.5 intervals, full at the start) and one for the sample left waiting at the end.
    assert 99 <= published <= 100 + 3
    assert waited > 0
