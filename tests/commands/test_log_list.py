"""`log_list`: the vehicle's own LOG_ENTRY list in the cmd_result, against a sim vehicle; refused while armed."""

from __future__ import annotations

import asyncio
from pathlib import Path

from nats.aio.client import Client

from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.ops.natsserver import NatsServer
from mavjet.sim.logs import LogServer, SimLog, synthetic_log
from tests.commands.test_log_download import VID, mavjet_logs, with_logs
from tests.support.commands import command_rig
from tests.support.wait import wait_for


async def test_lists_the_vehicles_logs(provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    async with command_rig(provisioned, nats_server.url, tmp_path / "state", configure=with_logs) as rig:
        await rig.link_known(VID)
        held = rig.vehicle(VID).logs.logs
        r = await rig.call(VID, "log_list")
        assert r.accepted, r
        assert [(e["log_id"], e["size_bytes"], e["time_utc_s"]) for e in r.data["logs"]] == [
            (lg.log_id, len(lg.data), lg.time_utc_s) for lg in held]
        assert r.data["logs"][0]["object"] == f"logs/{VID}/1-20261123T021320Z.bin"
        assert r.data["count"] == len(held) and r.data["total_bytes"] == sum(len(lg.data) for lg in held)
        assert r.detail.startswith(f"{len(held)} logs")
        assert rig.vehicle(VID).logs.requests == []  # a listing reads no log data


async def test_an_empty_vehicle_lists_nothing(provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    async with command_rig(provisioned, nats_server.url, tmp_path / "state", configure=with_logs) as rig:
        await rig.link_known(VID)
        rig.vehicle(VID).logs.logs.clear()
        r = await rig.call(VID, "log_list")
        assert r.accepted and r.data["logs"] == [] and r.data["count"] == 0, r


async def test_refused_while_armed(provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    """ArduPilot answers no LOG_REQUEST_LIST while armed (STATUSTEXT "Disarm for log download"): refused, not timed out."""
    async with command_rig(provisioned, nats_server.url, tmp_path / "state", configure=with_logs) as rig:
        await rig.link_known(VID)
        await rig.armed_in_guided(VID)
        r = await rig.call(VID, "log_list")
        assert r.result == "rejected" and "disarmed" in r.detail and "armed" in r.detail, r


async def test_cli_without_a_gateway_refuses_at_once_with_one_line(provisioned: Client, nats_server: NatsServer) -> None:
    """Nobody ever served the vehicle: `logs ls` says so in one line (exit 2, ops/resolve.py) instead of
    waiting out --timeout, and queues nothing a gateway that comes up later would run."""
    got = await asyncio.to_thread(mavjet_logs, nats_server.url, "ls", VID, "--timeout", "1s")
    assert got.returncode == 2, got.stderr
    lines = got.stderr.strip().splitlines()
    assert len(lines) == 1 and "no gateway has registered vehicle" in lines[0], got.stderr
    assert "Traceback" not in got.stderr
    info = await provisioned.jetstream().stream_info("TWIN_CMD")
    assert info.state.messages == 0


async def test_refused_while_a_download_runs(provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    """ArduPilot answers a LOG_REQUEST_LIST during a transfer with only "Log download in progress": refused at once."""
    async with command_rig(provisioned, nats_server.url, tmp_path / "state", configure=with_logs) as rig:
        await rig.link_known(VID)
        server = rig.vehicle(VID).logs
        server.logs.append(SimLog(3, 1_795_500_000, synthetic_log(3, 17_000) * 10))  # ~3 MB: seconds to serve
        started = await rig.call(VID, "log_download", {"log": "3"})
        assert started.accepted, started
        await wait_for(lambda: server.active, timeout_s=10)
        r = await rig.call(VID, "log_list")
        assert r.result == "rejected" and "log download" in r.detail, r


def test_the_sim_answers_a_list_during_a_transfer_with_only_a_text() -> None:
    """As AP_Logger::handle_log_request_list: `_log_sending_link` set -> "Log download in progress", no LOG_ENTRY."""
    server = LogServer(lambda: [SimLog(1, 1_795_400_000, synthetic_log(1, 3_000))])
    request = mavlink2.MAVLink_log_request_list_message(1, 1, 0, 0xFFFF)
    assert [m.get_type() for m in server.on_request_list(request)] == ["LOG_ENTRY"]
    server.on_request_data(mavlink2.MAVLink_log_request_data_message(1, 1, 1, 0, 0xFFFFFFFF))
    assert server.active
    listing = server.on_request_list(request)
    assert [(m.get_type(), m.text) for m in listing] == [("STATUSTEXT", "Log download in progress")]
