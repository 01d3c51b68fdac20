"""`mavjet cmd` and `mavjet bench commands` as processes."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from nats.aio.client import Client

from mavjet.ops.natsserver import NatsServer
from tests.support.commands import ENV, command_rig


async def mavjet(*args: str, timeout_s: float = 60.0) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "mavjet.ops", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    async with asyncio.timeout(timeout_s):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_cmd_wait_exit_status(provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    nats_args = ("--nats", nats_server.url, "--env", ENV)
    async with command_rig(provisioned, nats_server.url, tmp_path / "state") as rig:
        rc, out, err = await mavjet("cmd", "VID-001", "param_set", "--param", "name=RTL_ALT", "--param", "value=1800",
                                    "--wait", "--timeout", "20s", *nats_args)
        assert rc == 0, err
        assert "VID-001 param_set" in out and ": accepted" in out and "RTL_ALT = 1800" in out
        assert rig.vehicle("VID-001").params["RTL_ALT"] == 1800
        rc, out, err = await mavjet("cmd", "VID-001", "takeoff", "-p", "alt_m=10", "--wait", "--json", *nats_args)
        assert rc == 1, err
        doc = json.loads(out)
        assert doc["result"] == "rejected" and doc["detail"] == "takeoff needs the vehicle armed"
        assert doc["roundtrip_ms"] > 0
        # Refused before publishing: nothing reaches the stream or the gateway.
        handled = rig.service.lanes["VID-001"].executor.handled
        rc, out, err = await mavjet("cmd", "VID-001", "takeoff", "-p", "alt_m=900", "--wait", *nats_args)
        assert rc == 2 and "alt_m 900 outside [1, 500] m" in err
        rc, out, err = await mavjet("cmd", "VID-009", "land", "--wait", "--timeout", "1s", "--force", *nats_args)
        assert rc == 4 and "no cmd_result" in err
        assert rig.service.lanes["VID-001"].executor.handled == handled
    rc, _out, err = await mavjet("cmd", "VID-001", "land", "--nats", "nats://127.0.0.1:1", "--env", ENV)
    assert rc == 3 and "cannot reach NATS" in err


async def test_bench_commands_reports_both_figures(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    rc, _stdout, err = await mavjet("bench", "commands", "--vehicles", "2", "--duration", "2", "--warmup", "1",
                                   "--baseline-seconds", "1", "--json", str(out), timeout_s=120)
    assert rc == 0, err[-2000:]
    doc = json.loads(out.read_text())
    assert doc["links_up"] == 2
    cmd, base = doc["commands"], doc["baseline_jetstream_roundtrip"]
    assert cmd["count"] > 0 and set(cmd["results"]) == {"accepted"}
    assert base["count"] > 0
    assert 0 < cmd["p50_ms"] <= cmd["p99_ms"] and 0 < base["p50_ms"] <= base["p99_ms"]
    assert doc["ratio_throughput"] == round(cmd["per_s"] / base["per_s"], 3)
