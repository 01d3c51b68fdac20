"""The Containerfile's HEALTHCHECK, exactly as written, against a running gateway's /metrics.

The check's `--max-age` reads `mavjet_loop_last_tick_timestamp_seconds`, which the
gateway stamps on every publish tick: healthy while the loop runs, unhealthy
while the event loop is blocked (the metrics thread still answers, so a plain
"does /metrics answer" check would not notice), healthy again once it resumes.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import anyio
from nats.aio.client import Client

from mavjet.ops.natsserver import NatsServer
from mavjet.sim.fleet import SimConfig, SimFleet
from tests.support import gateway_config, running_gateway

from .test_container import HEALTHCHECK, final_stage


def containerfile_healthcheck_args() -> list[str]:
    """The HEALTHCHECK's options after `python /opt/mavjet/bin/mavjet-healthcheck`."""
    m = re.search(r"CMD (\[.*\])", dict(final_stage())["HEALTHCHECK"])
    assert m is not None
    cmd: list[str] = json.loads(m.group(1))
    return cmd[2:]


def run_check(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(HEALTHCHECK), *args], capture_output=True, text=True,
                          timeout=30, check=False)


def hang_loop_then_check(block_s: float, args: list[str]) -> subprocess.CompletedProcess[str]:
    """Block the calling event loop (a hung gateway), then run the check while it is still blocked."""
    time.sleep(block_s)
    return run_check(args)


async def test_containerfile_healthcheck_against_running_gateway(
    provisioned: Client, nats_server: NatsServer, tmp_path: Path
) -> None:
    args = containerfile_healthcheck_args()
    assert "--max-age" in args
    name, _, limit = args[args.index("--max-age") + 1].partition("=")
    assert name == "mavjet_loop_last_tick_timestamp_seconds" and float(limit) >= 10

    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=4.0)) as fleet:
        cfg = gateway_config(nats_server.url, fleet.endpoints, tmp_path / "state", metrics_port=0)
        async with running_gateway(cfg) as gw:
            assert gw.metrics_port
            url = ["--url", f"http://127.0.0.1:{gw.metrics_port}/metrics"]
            ok = await anyio.to_thread.run_sync(run_check, [*args, *url])
            assert ok.returncode == 0 and ok.stdout.strip() == "healthy", ok.stdout
            # The same gauge with a 1 s limit: fresh while the loop ticks...
            strict = [*url, "--max-age", f"{name}=1", "--require", "mavjet_nats_connected"]
            ok = await anyio.to_thread.run_sync(run_check, strict)
            assert ok.returncode == 0, ok.stdout
            # ...stale while the loop is blocked, though /metrics still answers from its thread...
            hung = hang_loop_then_check(1.5, strict)
            assert hung.returncode == 1 and f"{name} is" in hung.stdout and "old" in hung.stdout, hung.stdout
            # ...and fresh again once the loop runs.
            deadline = time.monotonic() + 10
            while True:
                again = await anyio.to_thread.run_sync(run_check, strict)
                if again.returncode == 0 or time.monotonic() > deadline:
                    break
                await anyio.sleep(0.2)
            assert again.returncode == 0, again.stdout
