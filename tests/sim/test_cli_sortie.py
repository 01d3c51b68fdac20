"""`mavjet sim` as a separate process, and the built-in sortie."""

from __future__ import annotations

import asyncio
import signal
import sys

import pytest

from mavjet.sim import cli
from tests.support import wait_for
from tests.support.sim import MavClient, running


async def test_cli_prints_endpoints_serves_mavlink_and_exits_0_on_sigterm() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "mavjet.ops", "sim", "--vehicles", "2", "--base-port", "0", "--speedup", "5",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        lines: list[str] = []
        async with asyncio.timeout(30):
            while not lines or not lines[-1].startswith("ready"):
                line = (await proc.stdout.readline()).decode()
                assert line, "sim exited before it was ready"
                lines.append(line.strip())
        assert lines[-1] == "ready vehicles=2"
        vehicles = [dict(kv.split("=") for kv in ln.split()[1:]) for ln in lines if ln.startswith("vehicle ")]
        assert [v["sysid"] for v in vehicles] == ["1", "2"]
        gcs = await MavClient.connect(vehicles[1]["endpoint"])
        try:
            hb = await gcs.recv("HEARTBEAT", timeout_s=10)
            assert hb.get_srcSystem() == 2
        finally:
            await gcs.close()
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(15):
            rc = await proc.wait()
        assert rc == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.parametrize(("argv", "needle"), [(["--speedup", "0"], "speedup"), (["--loss", "2"], "loss")])
def test_cli_bad_config_names_the_key(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    assert needle in capsys.readouterr().err


def test_cli_port_in_use_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert cli.main(["--vehicles", "1", "--base-port", str(port)]) == 1
    assert f"127.0.0.1:{port}" in capsys.readouterr().err


async def test_sortie_flies_and_lands_on_its_own() -> None:
    async with running(vehicles=2, speedup=40.0, sortie=True, tick_s=0.05) as fleet:
        v = fleet.vehicles[0]
        await wait_for(lambda: v.armed, timeout_s=15, interval_s=0.02)
        await wait_for(lambda: v.alt_m > 10.0, timeout_s=15, interval_s=0.02)
        max_dist = 0.0

        def away() -> bool:
            nonlocal max_dist
            home = v.home
            assert home is not None
            from mavjet.sim import geo

            max_dist = max(max_dist, geo.distance_m(home[0], home[1], v.lat_deg, v.lon_deg))
            return v.sortie.flights >= 1

        await wait_for(away, timeout_s=45, interval_s=0.02)
        assert max_dist > 30.0
        assert not v.armed or v.sortie.flights >= 1
        assert v.executions == []  # nobody commanded it
        # the second vehicle flies too, on its own schedule
        await wait_for(lambda: fleet.vehicles[1].sortie.flights >= 1 or fleet.vehicles[1].armed, timeout_s=30, interval_s=0.02)


async def test_sortie_steps_aside_when_a_ground_station_commands() -> None:
    from pymavlink.dialects.v20 import ardupilotmega as M

    async with running(speedup=40.0, sortie=True, tick_s=0.05) as fleet:
        v = fleet.vehicles[0]
        gcs = await MavClient.connect(fleet.endpoints[0])
        try:
            await wait_for(lambda: v.alt_m > 5.0, timeout_s=20, interval_s=0.02)
            await gcs.command_long(1, M.MAV_CMD_NAV_LAND)
            await wait_for(lambda: not v.armed, timeout_s=20, interval_s=0.02)
            await asyncio.sleep(1.0)  # 40 s of sim time: the sortie would have flown again
            assert not v.armed and v.external_control
        finally:
            await gcs.close()


async def test_bench_measures_a_small_fleet() -> None:
    import os

    from mavjet.sim import bench

    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    result = await bench.bench(vehicles=5, duration_s=2.0, fast_hz=10.0, slow_hz=2.0, warmup_s=1.0)
    assert result["vehicles"] == 5
    assert result["requested_msgs_per_s"] == 5 * 33.0
    assert result["crc_errors"] == 0 and result["checked_frames"] > 100
    assert 0.8 <= result["ratio"] <= 1.2
    assert 0.8 <= result["delivered_bytes_ratio"] <= 1.2
    assert result["sim_modules_compiled"] == 0  # the checkout's sources (tests/ops/test_compile.py: compiled)
    if cpus is not None:
        assert os.sched_getaffinity(0) == cpus  # the caller's CPU affinity is restored
