"""A killed gateway's vehicle is shown stale: real nats-server, real gateway process, the real CLI.

The sim runs 4x fast: with sample times taken from the autopilot's clock
(the old rule) its samples were dated in the future, so a dead vehicle's age
was negative and it looked alive. Times are now the gateway's receive time.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from nats.aio.client import Client

from mavjet.ops.natsserver import NatsServer
from mavjet.sim.fleet import SimConfig, SimFleet
from tests.support import ENV, wait_for_async


async def _cli(url: str, *argv: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "mavjet.ops", *argv, "--nats", url, "--env", ENV,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def _fleet_row(url: str, vid: str) -> str:
    rc, out, err = await _cli(url, "fleet", "--once")
    assert rc == 0, err
    rows = [ln for ln in out.splitlines() if ln.startswith(vid + " ")]
    return rows[0] if rows else ""


async def _twin(url: str, vid: str) -> dict[str, Any]:
    rc, out, err = await _cli(url, "twin", vid, "--json", "--events", "0")
    assert rc == 0, err
    doc: dict[str, Any] = json.loads(out)
    return doc


async def test_sigkilled_gateway_marks_its_vehicle_stale_within_10s(
    provisioned: Client, nats_server: NatsServer, tmp_path: Path
) -> None:
    url = nats_server.url
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=4.0)) as fleet:
        args = [sys.executable, "-m", "mavjet.ops", "gateway", "--nats", url, "--env", ENV,
                "--state-dir", str(tmp_path / "state"), "--instance", "doomed-gw", "--no-commands", "--no-shadow",
                "--vehicle", f"VID-001={fleet.endpoints[0]}"]
        log_path = tmp_path / "gateway.log"
        with log_path.open("wb") as log_file:
            proc = await asyncio.create_subprocess_exec(*args, stdout=log_file, stderr=log_file, env=dict(os.environ))
        try:
            async def live() -> bool:
                row = await _fleet_row(url, "VID-001")
                return " up " in row and "stale" not in row

            await wait_for_async(live, timeout_s=40)
            # SYSTEM_TIME has been received by now (1 Hz): the old rule would date samples ahead.
            await asyncio.sleep(2.0)
            before = await _twin(url, "VID-001")
            assert before["stale"] is False and before["stale_reason"] is None, before
            assert -1.0 < before["age_s"] < 5.0, before
            assert before["state"]["link"]["gateway"] == "doomed-gw"
            assert all(-1.0 < ch["age_s"] < 5.0 for ch in before["state"].values()), before["state"]
            row = await _fleet_row(url, "VID-001")
            assert " up " in row and "stale" not in row, row

            proc.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            await proc.wait()

            async def stale() -> bool:
                row = await _fleet_row(url, "VID-001")
                return "stale" in row

            await wait_for_async(stale, timeout_s=15)
            took_s = time.monotonic() - killed
            row = await _fleet_row(url, "VID-001")
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert took_s < 10.0, took_s
    assert "stale: gateway gone" in row and "ARMED" not in row and " up " not in row, row
    after = await _twin(url, "VID-001")
    assert after["stale"] is True and after["stale_reason"] == "gateway gone", after
    rc, out, err = await _cli(url, "fleet", "--once", "--json")
    assert rc == 0, err
    rows = {r["vid"]: r for r in json.loads(out)["vehicles"]}
    assert rows["VID-001"]["stale"] is True and rows["VID-001"]["stale_reason"] == "gateway gone"
    assert "armed" not in rows["VID-001"] and "last" in rows["VID-001"]
    # The liveness record is 1 Hz, samples 10 Hz: the newest sample may be younger than it.
    assert after["gateway_age_s"] > 5.0 and after["age_s"] > 3.5, after
