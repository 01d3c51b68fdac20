"""The fleet-wide state tick in steps: yielding between steps loses no vehicle and keeps each channel in order."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

import mavjet.gateway.daemon
from mavjet.contract import envelope
from mavjet.ops.natsserver import NatsServer
from mavjet.sim.fleet import SimConfig, SimFleet
from tests.support.gateway import ENV, gateway_config, running_gateway

VEHICLES = 40  # more than one step of 16 twins, so the tick yields in the middle


async def test_a_tick_cut_into_steps_publishes_every_vehicle_in_order(
    provisioned: Client, nats_server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mavjet.gateway.daemon, "TICK_STEP_S", 0.0)  # yield after every 16 twins
    monkeypatch.setattr(mavjet.gateway.daemon, "TICK_IDLE_STEP_S", 0.0)
    times: dict[str, list[int]] = {}
    yields = 0
    real_checkpoint = anyio.lowlevel.checkpoint

    async def counting_checkpoint() -> None:
        nonlocal yields
        yields += 1
        await real_checkpoint()

    monkeypatch.setattr(anyio.lowlevel, "checkpoint", counting_checkpoint)

    async def on_msg(msg: Msg) -> None:
        parts = msg.subject.split(".")
        times.setdefault(f"{parts[3]}.{parts[5]}", []).append(envelope.unpack(msg.data).time_ns)

    sub = await provisioned.subscribe(f"fleet.{ENV}.veh.*.state.>", cb=on_msg)
    async with SimFleet(SimConfig(vehicles=VEHICLES, base_port=0, speedup=1.0)) as fleet:
        cfg = gateway_config(nats_server.url, fleet.endpoints, tmp_path)
        async with running_gateway(cfg):
            with anyio.fail_after(30):
                while len({k.split(".")[0] for k in times if k.endswith(".position")}) < VEHICLES:
                    await anyio.sleep(0.1)
            await anyio.sleep(1.5)  # a link period, so the link channel's pass through all twins runs too
    await sub.unsubscribe()
    vids = {k.split(".")[0] for k in times}
    assert len(vids) == VEHICLES
    assert yields > 0, "the tick never yielded: the test did not exercise the steps"
    assert all(k.split(".")[0] + ".link" in times for k in times), "a vehicle missed its link sample"
    for key, ts in times.items():
        assert ts == sorted(ts), f"{key}: samples out of order across the tick's steps"


async def test_the_idle_step_grows_while_other_work_holds_the_loop_and_shrinks_back() -> None:
    """Overload: state gets as much of the loop as reading does, within bounds; a quiet loop gets 20 ms steps."""
    from mavjet.gateway.daemon import (
        TICK_IDLE_STEP_S,
        TICK_MAX_IDLE_STEP_S,
        _StepBudget,
        _TickSteps,
    )
    from mavjet.gateway.services import Foreground

    budget = _StepBudget()
    steps = _TickSteps(Foreground(), budget)
    assert budget.idle_s == TICK_IDLE_STEP_S

    async def hog_the_loop() -> None:
        end = time.perf_counter() + 2 * TICK_MAX_IDLE_STEP_S
        while time.perf_counter() < end:  # bounded: a busy pass of other work, as reading 4,000 sockets is
            pass

    async with anyio.create_task_group() as tg:
        tg.start_soon(hog_the_loop)
        await steps.next()  # the hog runs in this yield
    assert budget.idle_s == TICK_MAX_IDLE_STEP_S  # the gap was longer than the cap
    await steps.next()  # nothing else to run: a short gap
    assert budget.idle_s == TICK_IDLE_STEP_S


def test_the_link_rota_spreads_the_fleet_over_the_period_each_vehicle_once() -> None:
    period_ns = 1_000_000_000
    rota = mavjet.gateway.daemon.LinkRota(100, period_ns, 0)
    assert rota.take(0) == [0], "the first vehicle's link channel goes at once"
    taken: list[int] = []
    per_tick: list[int] = []
    for tick in range(1, 51):  # a period of 20-ms ticks
        due = rota.take(tick * 20_000_000)
        per_tick.append(len(due))
        taken += due
    assert sorted(taken) == list(range(100)), "every vehicle once a period (vehicle 0 again, a period on)"
    assert taken[-1] == 0
    assert max(per_tick) <= 3, f"a burst: {per_tick}"
    assert rota.take(50 * 20_000_000 + 5_000_000) == [], "half a vehicle's share of time: none yet"
    assert rota.take(50 * 20_000_000 + 10_000_000) == [1], "round-robin: the next one"


def test_a_stalled_loop_owes_each_vehicle_one_link_channel_not_a_backlog() -> None:
    rota = mavjet.gateway.daemon.LinkRota(10, 1_000_000_000, 0)
    assert rota.take(0) == [0]
    assert rota.take(5_000_000_000) == [*range(1, 10), 0], "five periods late: each vehicle once"
    assert rota.take(5_020_000_000) == [], "and no catching up after it"
    assert mavjet.gateway.daemon.LinkRota(0, 1_000_000_000, 0).take(10**12) == []


def test_foreground_says_when_the_first_urgent_work_starts_and_the_last_ends() -> None:
    from mavjet.gateway.services import Foreground

    changes: list[bool] = []
    fg = Foreground(on_change=changes.append)
    with fg.running():
        with fg.running():  # a second command meanwhile: no change
            assert fg.active == 2
        assert changes == [True]
    assert changes == [True, False] and fg.active == 0
    with pytest.raises(RuntimeError), fg.running():
        raise RuntimeError("a command's bug")
    assert changes == [True, False, True, False] and fg.active == 0  # ended, even by an error


async def test_a_running_command_makes_the_gateways_reads_urgent(
    provisioned: Client, nats_server: NatsServer, tmp_path: Path
) -> None:
    # The daemon wires its Foreground to the fleet's epoll (drivers/mavlink/reactor.py set_urgent).
    import asyncio

    from mavjet.drivers.mavlink.reactor import AVAILABLE, Reactor

    if not AVAILABLE:
        pytest.skip("epoll is Linux only")
    async with SimFleet(SimConfig(vehicles=2, base_port=0, speedup=1.0)) as fleet:
        cfg = gateway_config(nats_server.url, fleet.endpoints, tmp_path)
        async with running_gateway(cfg) as gw:
            reader = Reactor.existing(asyncio.get_running_loop())
            assert reader is not None and not reader.urgent
            with gw.context.foreground.running():
                assert reader.urgent
            assert not reader.urgent
