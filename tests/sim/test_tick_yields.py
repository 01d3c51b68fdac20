"""The fleet's tick looks at the sockets between chunks of vehicles: a command never waits for a whole fleet's step."""

from __future__ import annotations

import asyncio

import pytest

import mavjet.sim.cli
import mavjet.sim.fleet
import mavjet.sim.stepmode
import mavjet.sim.streams
import mavjet.sim.telemetry
from mavjet.sim.fleet import SimConfig, SimFleet
from mavjet.sim.model import VehicleModel
from mavjet.sim.vehicle import SimVehicle
from tests.support.compiled import interpreted_only


async def test_a_tick_of_many_vehicles_lets_other_work_run_between_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mavjet.sim.fleet, "TICK_CHUNK", 2)
    passes = 0
    seen: list[tuple[int, int]] = []  # (vehicle sysid, passes of the other task when it was stepped)
    real_tick = SimVehicle.tick

    def tick(self: SimVehicle, sim_now: float, wall: float) -> None:
        seen.append((self.sysid, passes))
        real_tick(self, sim_now, wall)

    monkeypatch.setattr(SimVehicle, "tick", tick)

    async def other_work() -> None:
        nonlocal passes
        for _ in range(100_000):  # bounded
            passes += 1
            await asyncio.sleep(0)

    async with SimFleet(SimConfig(vehicles=5, base_port=0, speedup=1.0, tick_s=0.05)):
        probe = asyncio.create_task(other_work())
        for _ in range(100):  # bounded: until a few ticks ran
            if len(seen) >= 15:
                break
            await asyncio.sleep(0.02)
        probe.cancel()
    ticks = [seen[i:i + 5] for i in range(0, len(seen) - len(seen) % 5, 5)]
    assert len(ticks) >= 2
    for t in ticks[1:]:  # the first tick may start before the other task does
        counts = [p for _, p in t]
        # Vehicles 1-2 in one chunk, 3-4 in the next, 5 in the last: the other task ran between chunks,
        # never inside one.
        assert counts[0] == counts[1] < counts[2] == counts[3] < counts[4], counts


def test_chunks_are_spread_over_the_tick_unless_in_step() -> None:
    firsts = list(range(0, 1000, mavjet.sim.fleet.TICK_CHUNK))
    spread = mavjet.sim.fleet.chunk_slots(1000, 0.05, in_step=False)
    assert [f for f, _ in spread] == firsts
    offsets = [o for _, o in spread]
    assert offsets[0] == 0.0 and offsets == sorted(offsets) and offsets[-1] < 0.05
    assert offsets[1] == pytest.approx(0.05 / len(firsts))
    assert mavjet.sim.fleet.chunk_slots(1000, 0.05, in_step=True) == [(f, 0.0) for f in firsts]
    assert mavjet.sim.fleet.chunk_slots(1, 0.05, in_step=False) == [(0, 0.0)]


async def test_out_of_step_vehicles_of_later_chunks_are_stepped_later_in_the_tick(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mavjet.sim.fleet, "TICK_CHUNK", 2)
    walls: dict[int, list[float]] = {}
    real_tick = SimVehicle.tick

    def tick(self: SimVehicle, sim_now: float, wall: float) -> None:
        walls.setdefault(self.sysid, []).append(wall)
        real_tick(self, sim_now, wall)

    monkeypatch.setattr(SimVehicle, "tick", tick)
    period = 0.06
    async with SimFleet(SimConfig(vehicles=5, base_port=0, speedup=1.0, tick_s=period)):
        for _ in range(100):  # bounded: until a few ticks ran
            if len(walls.get(5, [])) >= 4:
                break
            await asyncio.sleep(0.02)
    n = min(len(walls[1]), len(walls[5]))
    assert n >= 4
    # Three chunks: vehicle 5 (the third) is stepped two thirds of a period after vehicle 1 of its tick,
    # never earlier (a sleep never ends early; a busy machine may make it later).
    for first, last in zip(walls[1][:n], walls[5][:n], strict=True):
        assert last - first >= period * 2 / 3 - 0.001, (first, last)


@pytest.mark.parametrize(("env", "argv", "in_step"), [
    (None, [], False), ("1", [], True), ("0", [], False), ("", [], False), (None, ["--in-step"], True),
])
def test_in_step_from_the_flag_or_the_environment(monkeypatch: pytest.MonkeyPatch, env: str | None,
                                                  argv: list[str], in_step: bool) -> None:
    if env is None:
        monkeypatch.delenv(mavjet.sim.stepmode.IN_STEP_ENV, raising=False)
    else:
        monkeypatch.setenv(mavjet.sim.stepmode.IN_STEP_ENV, env)
    args = mavjet.sim.cli.build_parser().parse_args(argv)
    assert mavjet.sim.cli.config_from_args(args).in_step is in_step


def test_heartbeat_phases_spread_a_fleet_over_the_second_unless_in_step() -> None:
    phases = [mavjet.sim.fleet.heartbeat_phase_s(i, in_step=False) for i in range(1000)]
    assert phases[0] == 0.0 and all(0.0 <= p < 1.0 for p in phases)
    # Any first k vehicles are spread evenly: every tenth of the second has its share, for 10 as for 1,000.
    for k in (10, 100, 1000):
        tenths = [sum(1 for p in phases[:k] if t / 10 <= p < (t + 1) / 10) for t in range(10)]
        assert min(tenths) >= k // 10 - 1 and max(tenths) <= k // 10 + 1, (k, tenths)
    assert {mavjet.sim.fleet.heartbeat_phase_s(i, in_step=True) for i in range(1000)} == {0.0}


@interpreted_only("mavjet.sim.telemetry")  # patches telemetry.emit, which compiled code calls directly
async def test_out_of_step_vehicles_heartbeat_at_their_own_instants_of_the_second(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each vehicle's first HEARTBEAT comes at its phase, and the next ones a period apart from it."""
    sent: dict[int, list[float]] = {}
    real_emit = mavjet.sim.telemetry.emit

    def emit(v: VehicleModel, msg_id: int) -> None:
        if msg_id == mavjet.sim.streams.HEARTBEAT:
            sent.setdefault(v.sysid, []).append(v.now)
        real_emit(v, msg_id)

    monkeypatch.setattr(mavjet.sim.telemetry, "emit", emit)
    async with SimFleet(SimConfig(vehicles=4, base_port=0, speedup=1.0, tick_s=0.02)):
        for _ in range(200):  # bounded: until every vehicle sent two heartbeats
            if len(sent) == 4 and all(len(t) >= 2 for t in sent.values()):
                break
            await asyncio.sleep(0.02)
    assert len(sent) == 4
    for i, sysid in enumerate(sorted(sent)):
        phase = mavjet.sim.fleet.heartbeat_phase_s(i, in_step=False)
        first, second = sent[sysid][:2]
        assert second - first == pytest.approx(1.0, abs=0.03)
        # Sent in the tick at or just after the vehicle's slot in the second (a 20-ms tick, a busy machine).
        offset = (first - phase) % 1.0
        assert offset < 0.1, (sysid, phase, sent[sysid])
    assert len({round(t[0] % 1.0, 1) for t in sent.values()}) >= 3, "the heartbeats came at one instant"
