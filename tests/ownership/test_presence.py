"""Standbys are visible: two real gateways for one sim vehicle on a real nats-server.

The standby writes its presence record (docs/ownership.md, "Presence"); `mavjet twin` (the CLI, in a
thread) lists the owner and the standby, `mavjet fleet` counts it, /metrics says each gateway's role.
A crashed standby's record is shown as gone after 3 periods; a cleanly stopped one's is deleted.
The period is 1 s here (5 s by default) so that takes 3 s, not 15.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from nats.aio.client import Client

from mavjet.gateway.daemon import Gateway
from mavjet.ops import fleet, twin
from mavjet.ops.natsserver import NatsServer
from mavjet.ops.read import GATEWAY_MISSED_PERIODS, read_presence
from mavjet.sim.fleet import SimConfig, SimFleet
from tests.ownership.support import Crashable, command_gateway, holder_of, owns, sees_owner
from tests.support.commands import TEST_COMMANDS
from tests.support.gateway import ENV, running
from tests.support.wait import wait_for, wait_for_async

VID = "VID-001"
PERIOD_S = 1.0


def _gateway(url: str, sim: SimFleet, state_dir: Path, instance: str) -> Gateway:
    gw, _ = command_gateway(url, sim.endpoints, state_dir, instance, commands=TEST_COMMANDS)
    assert gw.ownership is not None
    gw.ownership.presence.every_s = PERIOD_S  # read when its writer starts
    return gw


async def _twin_json(url: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    code = await anyio.to_thread.run_sync(twin.main, [VID, "--json", "--nats", url, "--env", ENV])
    assert code == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


async def test_twin_and_fleet_show_the_standby_until_it_goes(
        provisioned: Client, nats_server: NatsServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = nats_server.url
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=5.0)) as sim:
        a = _gateway(url, sim, tmp_path / "a", "gw-a")
        b = _gateway(url, sim, tmp_path / "b", "gw-b")
        standby = Crashable(b)
        async with running(a), anyio.create_task_group() as tg:
            await wait_for(lambda: owns(a, VID), timeout_s=10)
            tg.start_soon(standby.run)
            await wait_for(lambda: sees_owner(b, a, VID) and b.twins[VID].link.is_up, timeout_s=10)

            async def standby_listed() -> list[Any] | None:
                seen = await read_presence(provisioned, ENV, VID)
                return [s for s in seen or [] if s.holder == holder_of(b) and s.link == "up"] or None

            await wait_for_async(standby_listed, timeout_s=PERIOD_S + 3)
            # `mavjet twin`: the owner from its lease, the standby from its record, both fresh.
            doc = (await _twin_json(url, capsys))["ownership"]
            assert doc["readable"] is True
            assert doc["owner"]["holder"] == holder_of(a) and doc["owner"]["gone"] is False
            [sb] = doc["standbys"]
            assert (sb["holder"], sb["owner"], sb["link"], sb["gone"]) == (holder_of(b), holder_of(a), "up", False)
            # `mavjet fleet --once --json`: the owner and one live standby.
            async def fleet_row() -> tuple[fleet.FleetView, dict[str, Any]] | None:
                view = await fleet.snapshot(provisioned, ENV)
                rows: list[dict[str, Any]] = view.to_json(dt.datetime.now(dt.UTC))["vehicles"]  # type: ignore[assignment]
                return (view, rows[0]) if rows and rows[0]["owner"] else None  # once the link record is out

            view, row = await wait_for_async(fleet_row, timeout_s=5)
            assert row["owner"] == holder_of(a) and row["standbys"] == 1
            assert view.rows(dt.datetime.now(dt.UTC))[0][10] == "1"  # the STBY column
            # /metrics: each gateway's vehicles by its role (a handful of series, whatever the fleet).
            by_role = "mavjet_vehicles_by_role"
            assert a.metrics.registry.get_sample_value(by_role, {"role": "owner"}) == 1.0
            assert b.metrics.registry.get_sample_value(by_role, {"role": "standby"}) == 1.0
            assert b.metrics.registry.get_sample_value("mavjet_vehicle_lease_state",
                                                       {"vehicle": VID, "state": "standby", "holder": holder_of(a)}) == 1.0

            # The standby crashes: its record stays and is shown as gone after 3 periods.
            crashed = await standby.crash()
            gone_after_s = GATEWAY_MISSED_PERIODS * PERIOD_S

            async def shown_gone() -> dict[str, Any] | None:
                d = (await _twin_json(url, capsys))["ownership"]
                return d if d["standbys"] and d["standbys"][0]["gone"] else None

            d = await wait_for_async(shown_gone, timeout_s=gone_after_s + PERIOD_S + 3, interval_s=0.25)
            shown_gone_s = time.monotonic() - crashed
            # Not before its last write was 3 periods old (at most one period before the crash), nor long after.
            assert gone_after_s - PERIOD_S <= shown_gone_s <= gone_after_s + PERIOD_S + 1.0, shown_gone_s
            assert d["owner"]["holder"] == holder_of(a)
            assert (await fleet.snapshot(provisioned, ENV)).standbys(VID, dt.datetime.now(dt.UTC)) == 0

            # A standby stopped cleanly deletes its record: gone from the listing at once.
            c = _gateway(url, sim, tmp_path / "c", "gw-c")
            async with running(c):
                await wait_for(lambda: sees_owner(c, a, VID), timeout_s=10)

                async def c_listed() -> bool:
                    return any(s.holder == holder_of(c) for s in await read_presence(provisioned, ENV, VID) or [])

                await wait_for_async(c_listed, timeout_s=PERIOD_S + 3)
            assert not await c_listed()
