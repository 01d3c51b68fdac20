"""Samples due on arrival are queued for the next tick, one per channel, newest in place; the rest wait in the twin."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from mavjet.contract import envelope
from mavjet.drivers.mavlink.transport import Endpoint
from mavjet.gateway.config import DEFAULT_RATES_HZ, GatewayConfig, VehicleConfig
from mavjet.gateway.publish.publisher import Publisher
from mavjet.gateway.publish.spool import Spool
from mavjet.gateway.runtime.metrics import GatewayMetrics
from mavjet.gateway.twin.budget import EventBudget
from mavjet.gateway.twin.clock import GatewayClock
from mavjet.gateway.twin.samples import ReadyStates
from mavjet.gateway.twin.vehicle import (
    STEP_CHECK_EVERY,
    VehicleTwin,
    collect_fleet_due,
    collect_fleet_links,
)

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

    # The bucket starts full (GCRA, gateway/twin/samples.py): 3 is due at once, and attitude's next
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


def _fleet(tmp_path: Path, spool: Spool, ready: ReadyStates, clock: _Clock, n: int) -> list[VehicleTwin]:
    twins = []
    for i in range(n):
        (tmp_path / str(i)).mkdir()
        twins.append(_twin(tmp_path / str(i), spool, ready, clock))
    return twins


def _waiting(twins: list[VehicleTwin], ready: ReadyStates, clock: _Clock, at_ms: int = 0) -> None:
    """Each twin an attitude sample waiting in `fresh`, due at `at_ms` + 50 ms (as in the test above)."""
    for i, twin in enumerate(twins):
        _sample(twin, clock, at_ms, "attitude", i)
        ready.take()
        _sample(twin, clock, at_ms + 25, "attitude", i)
        ready.take()
        _sample(twin, clock, at_ms + 30, "attitude", i)
    assert all(twin.fresh for twin in twins) and not ready.items


async def test_the_fleet_collection_stops_at_its_deadline_every_16_twins_and_resumes(tmp_path: Path, spool: Spool) -> None:
    ready, clock = ReadyStates(), _Clock()
    twins = _fleet(tmp_path, spool, ready, clock, 40)
    _waiting(twins, ready, clock)
    out: list[tuple[str, bytes, int]] = []
    dirty: set[VehicleTwin] = set()
    due_ns = T0_NS + 50 * MS
    # A deadline already passed: a step of 16 twins, then the ticker publishes and yields.
    assert collect_fleet_due(twins, 0, due_ns, out, dirty=dirty, end_s=0.0) == STEP_CHECK_EVERY
    assert len(out) == STEP_CHECK_EVERY and not dirty
    assert collect_fleet_due(twins, 16, due_ns, out, dirty=dirty, end_s=0.0) == 32
    assert collect_fleet_due(twins, 32, due_ns, out, dirty=dirty, end_s=time.perf_counter() + 60) == 40
    assert sorted(envelope.unpack(p).data["i"] for _, p, _ in out) == list(range(40))
    # Not yet due: each twin goes back to the dirty set, nothing is collected.
    _waiting(twins, ready, clock, at_ms=1000)
    out.clear()
    assert collect_fleet_due(twins, 0, T0_NS + 1040 * MS, out, dirty=dirty, end_s=time.perf_counter() + 60) == 40
    assert out == [] and dirty == set(twins)


async def test_one_twins_error_does_not_stop_the_fleets_collection(tmp_path: Path, spool: Spool) -> None:
    ready, clock = ReadyStates(), _Clock()
    twins = _fleet(tmp_path, spool, ready, clock, 3)
    _waiting(twins, ready, clock)
    twins[1].fresh.clear()
    twins[1].fresh.add(None)  # type: ignore[arg-type]  # a corrupt channel: collect_due raises on it
    out: list[tuple[str, bytes, int]] = []
    dirty: set[VehicleTwin] = set()

    def errors() -> float | None:
        return twins[1].metrics.registry.get_sample_value("mavjet_errors_total", {"where": "publish"})

    with structlog.testing.capture_logs() as logs:
        assert collect_fleet_due(twins, 0, T0_NS + 50 * MS, out, dirty=dirty, end_s=time.perf_counter() + 60) == 3
    assert sorted(envelope.unpack(p).data["i"] for _, p, _ in out) == [0, 2]
    assert not twins[1].fresh and errors() == 1  # its waiting samples are dropped, counted
    assert [e["event"] for e in logs] == ["publish_failed"]
    # The link channel's pass: every twin's link sample, in steps, the failing one counted.
    links: list[tuple[str, bytes, int]] = []
    twins[1].budget = _BrokenBudget(twins[1].cfg.event_budget)  # its collect_link raises
    assert collect_fleet_links(twins, [2, 1, 0], 0, now_ns=T0_NS, out=links, end_s=time.perf_counter() + 60) == 3
    assert [s.rsplit(".", 1)[1] for s, _, _ in links] == ["link", "link"] and errors() == 2


class _BrokenBudget(EventBudget):
    @property  # type: ignore[override]
    def holding(self) -> bool:
        raise RuntimeError("a bug in one vehicle's budget")

    @holding.setter
    def holding(self, value: bool) -> None:
        pass
