"""Immediate drift: a shadowed param changed on the vehicle is reported and restored within a second or two.

A ground station (or RC) sets a param on the vehicle; ArduPilot announces it
with an unsolicited PARAM_VALUE. The shadow hears it through the twin (an
internal `param_value` event), writes `reported` with the drift, and a pass
puts desired back, long before the 60 s periodic verify would notice.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client

from mavjet.gateway.shadow.diff import LiveConfig
from mavjet.gateway.shadow.document import parse_desired
from mavjet.gateway.shadow.steps.params import on_param_value
from mavjet.sim import params
from mavjet.sim.fleet import SimFleet
from tests.shadow.harness import FAST, Shadowed, shadowed
from tests.support import wait_for

VID = "VID-001"
REAL = dataclasses.replace(FAST, verify_interval_s=60.0)  # the production interval: drift must not wait for it


@pytest.fixture
async def sh60(provisioned: Client, nats_server: Any, fleet1: SimFleet, tmp_path: Path) -> AsyncIterator[Shadowed]:
    async with shadowed(provisioned, nats_server.url, fleet1, tmp_path / "state", REAL) as s:
        yield s


async def test_param_changed_by_a_ground_station_is_reported_and_restored(sh60: Shadowed) -> None:
    v = sh60.fleet.vehicles[0]
    rev = await sh60.set_desired(VID, {"params": {"RTL_ALT": 2500}})
    await sh60.wait_converged(VID, rev)
    seen: list[dict[str, Any]] = []
    watcher = await sh60.kv.watch(sh60.key(VID, "reported"))

    async def record() -> None:
        async for entry in watcher:  # every write, however quickly the next one follows
            if entry is not None and entry.value:
                seen.append(json.loads(entry.value))  # noqa: PERF401 (seen is read while the watch runs)

    recorder = asyncio.create_task(record())
    try:
        await asyncio.sleep(0.5)
        # As ArduPilot does after a PARAM_SET from another link: store, then broadcast PARAM_VALUE.
        t0 = time.monotonic()
        v.params["RTL_ALT"] = 1200.0
        v._send_param(params.INDEX["RTL_ALT"])
        await wait_for(lambda: v.params["RTL_ALT"] == 2500.0, 5, 0.02)
        restored_s = time.monotonic() - t0
        await sh60.wait_reported(VID, lambda r: r["converged"] and r["params"] == {"RTL_ALT": 2500} and not r["delta"], 5)
        await wait_for(lambda: seen and seen[-1]["converged"], 5)
    finally:
        recorder.cancel()
        await watcher.stop()  # type: ignore[no-untyped-call]
    assert restored_s < 2.0, restored_s
    drifted = [r for r in seen if r["params"] == {"RTL_ALT": 1200}]
    assert drifted, seen
    assert drifted[0]["converged"] is False
    assert drifted[0]["delta"]["params.RTL_ALT"]["reason"] == "changed on the vehicle"
    assert drifted[0]["delta"]["params.RTL_ALT"]["reported"] == 1200


def test_on_param_value_is_pure_and_ignores_what_is_not_shadowed() -> None:
    d = parse_desired(json.dumps({"params": {"RTL_ALT": 2500}}), 7)
    live = LiveConfig()
    assert on_param_value(d, live, "WPNAV_SPEED", 900.0, 9) is None and "WPNAV_SPEED" not in live.params
    assert on_param_value(d, live, "RTL_ALT", 2500.0, 9) is None and live.params["RTL_ALT"] == (2500.0, 9)
    found = on_param_value(d, live, "RTL_ALT", 1200.0, 9)
    assert found is not None and found.path == "params.RTL_ALT" and found.reported == 1200
    assert live.params["RTL_ALT"] == (1200.0, 9)
