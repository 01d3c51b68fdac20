"""`mavjet rollout` over 200 sim vehicles behind one real gateway, on a real nats-server.

Three injected failures: VID-007 ignores PARAM_SET (as ArduPilot ignores a
set it will not take), VID-013 stays armed, VID-021's link drops. With
`--max-failures 2` the rollout gets through the canary and the 10% wave (two
failures), halts in the 50% wave at the third, and never starts the last
wave. The operator process is SIGKILLed in the middle of a wave and the
rollout is resumed from what TWIN_ROLLOUTS holds.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from nats.aio.client import Client
from nats.js import api as jsapi

from mavjet.contract.envelope import unpack
from mavjet.contract.events import EventType
from mavjet.contract.subjects import (
    ROLLOUTS_BUCKET,
    SHADOW_BUCKET,
    rollout_event_filter,
    rollout_key,
    shadow_key,
)
from mavjet.ops import rollout as cli
from mavjet.ops.natsserver import NatsServer
from mavjet.ops.rollout_plan import Failure, Rollout, RolloutStatus, Step
from mavjet.ops.rollout_store import RolloutStore
from mavjet.sim import model
from mavjet.sim.fleet import SimConfig, SimFleet
from mavjet.sim.stores import _param_name
from tests.shadow.harness import shadowed
from tests.support import ENV, collect_events, wait_for_async

pytestmark = pytest.mark.waits  # mostly waits on the gateway, the deadlines and a child process

N = 200
REFUSES, ARMED, DROPS = 7, 13, 21  # sysids; VID-<sysid:03d>
ROOT = Path(__file__).resolve().parents[2]


def vid(sysid: int) -> str:
    return f"VID-{sysid:03d}"


@pytest.fixture
async def fleet200(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[SimFleet]:
    orig = model._HANDLERS["PARAM_SET"]

    def refusing(v: Any, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
        if v.sysid == REFUSES and _param_name(msg.param_id) == "RTL_ALT":
            return
        orig(v, msg, partner, now, wall)

    monkeypatch.setitem(model._HANDLERS, "PARAM_SET", refusing)
    async with SimFleet(SimConfig(vehicles=N, base_port=0, speedup=4.0)) as fleet:
        yield fleet


async def stored(nc: Client, rollout_id: str) -> Rollout:
    kv = await nc.jetstream().key_value(ROLLOUTS_BUCKET)
    return Rollout.from_json(json.loads((await kv.get(rollout_key(ENV, rollout_id))).value or b"{}"))


async def rollout_events(nc: Client, rollout_id: str) -> list[str]:
    js = nc.jetstream()
    sub = await js.subscribe(rollout_event_filter(ENV, rollout_id), ordered_consumer=True,
                             config=jsapi.ConsumerConfig(deliver_policy=jsapi.DeliverPolicy.ALL))
    out: list[str] = []
    try:
        for _ in range(100):
            try:
                msg = await sub.next_msg(timeout=1.0)
            except Exception:
                break
            unpack(msg.data)
            out.append(msg.subject.rsplit(".", 1)[-1])
            if msg.metadata.num_pending == 0:
                break
    finally:
        await sub.unsubscribe()
    return out


async def test_200_vehicles_halt_at_the_threshold_resume_after_sigkill_and_roll_back(
    provisioned: Client, nats_server: NatsServer, fleet200: SimFleet, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = nats_server.url
    async with shadowed(provisioned, url, fleet200, tmp_path / "state") as sh:
        store = await RolloutStore.open(provisioned, ENV)
        for i in range(1, N + 1):
            await store.set_tags(vid(i), {"site": "north"}, 0)

        async def all_meta() -> bool:
            views = await store.tag_views()
            return sum(1 for meta, _ in views.values() if meta.get("type") == "copter") == N

        await wait_for_async(all_meta, 30)
        armed = fleet200.vehicle(ARMED)
        armed.params["DISARM_DELAY"] = 0  # no auto-disarm on the ground
        assert armed.arm(force=True) == 0
        fleet200.vehicle(DROPS).drop_link(120.0)

        argv = ["--nats", url, "--env", ENV]
        log = (tmp_path / "operator.log").open("wb")
        op = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "mavjet.ops.rollout", "start", "params.RTL_ALT=2500", "--select",
            "type=copter,site=north", "--canary", "1", "--waves", "10%,50%,100%", "--max-failures", "2",
            "--disarm-timeout", "4s", "--converge-timeout", "30s", "--reject-attempts", "2", "--tick", "0.3s",
            "--id", "big", *argv,
            cwd=ROOT, stdout=log, stderr=log, env={**os.environ, "MAVJET_PLAIN": "1"})
        try:
            async def mid_wave() -> bool:
                try:
                    r = await stored(provisioned, "big")
                except Exception:
                    return False
                wave1 = r.in_wave(1)
                # written (whether converged yet or not), while VID-013's disarm deadline holds the wave open
                return r.wave == 1 and sum(v.revision > 0 for v in wave1) >= 5

            await wait_for_async(mid_wave, 30, what="the operator in the middle of the 10% wave")
            op.send_signal(signal.SIGKILL)
            with anyio.fail_after(5):
                assert await op.wait() == -signal.SIGKILL
        finally:
            if op.returncode is None:
                op.kill()
                await op.wait()
            log.close()
        killed = await stored(provisioned, "big")
        assert killed.status is RolloutStatus.RUNNING and killed.waves == (1, 20, 100, 200)
        assert killed.vehicles[vid(1)].step is Step.CONVERGED  # the canary, before the kill

        rc = await anyio.to_thread.run_sync(cli.main, ["resume", "big", "--tick", "0.3s", *argv])
        out = capsys.readouterr().out
        assert rc == 1, out
        r = await stored(provisioned, "big")
        assert r.status is RolloutStatus.HALTED and "3 failures exceed --max-failures 2" in r.reason
        failed = {v.vid: v.failure for v in r.vehicles.values() if v.step is Step.FAILED}
        assert failed == {vid(REFUSES): Failure.REJECTED, vid(ARMED): Failure.ARMED, vid(DROPS): Failure.LINK}
        assert all(v.step is Step.PENDING for v in r.in_wave(3))  # the last wave never started
        assert all(v.step in (Step.CONVERGED, Step.FAILED) for v in r.in_wave(0) + r.in_wave(1))
        assert "halted" in out and vid(ARMED) in out  # the table of what did not converge
        # the written vehicles really have it: desired, and the simulated autopilot's parameter
        for i in (2, 19, 30):
            v = r.vehicles[vid(i)]
            if v.step is Step.CONVERGED:
                assert fleet200.vehicle(i).params["RTL_ALT"] == 2500
        rev, desired = await sh.get(vid(2), "desired")
        assert desired == {"params": {"RTL_ALT": 2500}} and rev == r.vehicles[vid(2)].revision

        assert await rollout_events(provisioned, "big") == [
            EventType.ROLLOUT_STARTED, EventType.ROLLOUT_WAVE, EventType.ROLLOUT_WAVE, EventType.ROLLOUT_HALTED]
        per_vehicle = [e for e in await collect_events(provisioned, f"fleet.{ENV}.veh.*.evt.{EventType.ROLLOUT_VEHICLE}")]
        results = {(v, d["result"]) for v, _t, d, _m in per_vehicle}
        assert (vid(ARMED), Step.FAILED.value) in results and (vid(1), Step.CONVERGED.value) in results
        assert len(per_vehicle) == len({v for v, _ in results})  # one each: the resumed pass did not repeat any

        # roll back: each written vehicle's previous desired (none) comes back
        rc = await anyio.to_thread.run_sync(cli.main, ["rollback", "big", "--json", *argv])
        out = capsys.readouterr().out  # the gateway's log lines share stdout with the command's JSON
        assert rc == 0 and '"status": "rolled_back"' in out
        r = await stored(provisioned, "big")
        assert r.status is RolloutStatus.ROLLED_BACK
        steps = {v.vid: v.step for v in r.vehicles.values()}
        assert steps[vid(1)] is steps[vid(REFUSES)] is Step.ROLLED_BACK and steps[vid(150)] is Step.SKIPPED
        assert [v for v, s in steps.items() if s is Step.FAILED] == [vid(ARMED), vid(DROPS)]  # never written
        kv = await provisioned.jetstream().key_value(SHADOW_BUCKET)
        for i in (1, 2, REFUSES):
            with pytest.raises(Exception):  # noqa: B017 (KeyDeletedError or KeyNotFoundError: desired is gone)
                await kv.get(shadow_key(ENV, vid(i), "desired"))
