"""`mavjet rollout` commands on a real nats-server with three sim vehicles behind a real gateway."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from nats.aio.client import Client

from mavjet.contract.subjects import ROLLOUTS_BUCKET, rollout_key
from mavjet.ops import rollout as cli
from mavjet.ops.natsserver import NatsServer
from mavjet.ops.rollout_plan import Rollout, RolloutStatus, Step
from mavjet.ops.rollout_store import RolloutStore
from mavjet.sim.fleet import SimConfig, SimFleet
from tests.shadow.harness import shadowed
from tests.support import ENV, wait_for_async


@pytest.fixture
async def fleet3() -> AsyncIterator[SimFleet]:
    async with SimFleet(SimConfig(vehicles=3, base_port=0, speedup=4.0)) as fleet:
        yield fleet


def test_help_and_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ei:
        cli.main(["--help"])
    assert ei.value.code == 0 and "canary" in capsys.readouterr().out
    # bad input: one line, exit 2, before anything is written (no server listens on port 1)
    assert cli.main(["start", "params.RTL_ALT=1", "--vehicles", "V1", "--id", "a.b", "--nats", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "subject token" in err


async def rollout(url: str, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = int(await anyio.to_thread.run_sync(cli.main, [*argv, "--nats", url, "--env", ENV]))
    out, err = capsys.readouterr()
    return rc, out, err


async def test_tags_select_status_abort_and_rollback(
    provisioned: Client, nats_server: NatsServer, fleet3: SimFleet, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = nats_server.url
    async with shadowed(provisioned, url, fleet3, tmp_path / "state") as sh:
        before = await sh.set_desired("VID-001", {"params": {"LAND_SPEED": 60}})
        for v in ("VID-001", "VID-003"):
            assert (await rollout(url, capsys, "tag", v, "site=north", "spare=1"))[0] == 0
        rc, out, _ = await rollout(url, capsys, "tag", "VID-003", "spare=")
        assert rc == 0 and json.loads(out.splitlines()[-1]) == {"site": "north"}

        async def metas() -> bool:
            rc, out, _ = await rollout(url, capsys, "tags", "--json")
            views = json.loads(out[out.index("{"):])
            return rc == 0 and all(views.get(f"VID-00{i}", {}).get("type") == "copter" for i in (1, 2, 3))

        await wait_for_async(metas, 20)
        bad = await rollout(url, capsys, "start", "params.RTL_ALT=1", "--select", "site=east")
        assert bad[0] == 2 and "no vehicle matches" in bad[2]
        rc, out, _ = await rollout(url, capsys, "start", "params.RTL_ALT=1800", "--select", "site=north,type=copter",
                                   "--id", "one", "--detach")
        assert rc == 0 and out.strip().splitlines()[-1] == "one"
        rc, out, _ = await rollout(url, capsys, "status", "--json")
        [brief] = json.loads(out[out.index("["):])
        assert brief["id"] == "one" and brief["vehicles"] == 2 and brief["status"] == RolloutStatus.RUNNING.value

        rc, out, err = await rollout(url, capsys, "resume", "one", "--tick", "0.2s")
        assert rc == 0, out + err
        assert "rollout one: done, wave 2/2, 2/2 converged, 0 failed" in out
        assert "wave 2/2" in err  # the plain progress lines
        rc, out, _ = await rollout(url, capsys, "status", "one")
        assert rc == 0 and "VID-001" in out and "VID-003" in out and "VID-002" not in out
        _, desired = await sh.get("VID-001", "desired")
        assert desired == {"params": {"LAND_SPEED": 60, "RTL_ALT": 1800}}

        # a driver killed after writing a vehicle's desired but before storing that: resume adopts the write
        assert (await rollout(url, capsys, "start", "params.RTL_ALT=1700", "--vehicles", "VID-002", "--id", "kill",
                              "--canary", "0", "--detach"))[0] == 0
        store = await RolloutStore.open(provisioned, ENV)
        r, _ = await store.load("kill")
        first = await store.write_desired(r, "VID-002")
        assert first.revision and first.failure is None
        rc, out, _ = await rollout(url, capsys, "resume", "kill", "--tick", "0.2s")
        assert rc == 0, out
        r, _ = await store.load("kill")
        assert r.vehicles["VID-002"].revision == first.revision  # not written a second time
        assert r.vehicles["VID-002"].previous_revision == first.previous_revision == 0

        # a second one, aborted before it is driven: resume does nothing, its vehicles are skipped
        assert (await rollout(url, capsys, "start", "rates.position=4", "--vehicles", "VID-002", "--id", "two",
                              "--detach"))[0] == 0
        rc, out, _ = await rollout(url, capsys, "abort", "two", "--reason", "wrong rate")
        assert rc == 0 and "aborted" in out and "wrong rate" in out
        rc, out, _ = await rollout(url, capsys, "resume", "two")
        assert rc == 1 and "aborted" in out

        # rolling the first back restores VID-001's previous desired; VID-003 had none
        rc, out, _ = await rollout(url, capsys, "rollback", "one")
        assert rc == 0 and "rolled_back" in out
        rev, desired = await sh.get("VID-001", "desired")
        assert desired == {"params": {"LAND_SPEED": 60}} and rev > before
        kv = await provisioned.jetstream().key_value(ROLLOUTS_BUCKET)
        r = Rollout.from_json(json.loads((await kv.get(rollout_key(ENV, "one"))).value or b"{}"))
        assert r.status is RolloutStatus.ROLLED_BACK and {v.step for v in r.vehicles.values()} == {Step.ROLLED_BACK}
