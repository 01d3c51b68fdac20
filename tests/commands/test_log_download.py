"""`log_download` end to end: sim vehicle → gateway → TWIN_BLOBS, with progress events, refusals and resumption."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg

from mavjet.contract.envelope import unpack
from mavjet.gateway.commands.logs import LogDownloadConfig, LogDownloadService
from mavjet.gateway.daemon import Gateway
from mavjet.gateway.stores.logstore import fetch_log, split_object
from mavjet.ops.natsserver import NatsServer
from mavjet.sim.fleet import SimConfig
from mavjet.sim.logs import LOG_DATA_BYTES
from tests.support.commands import ENV, command_rig
from tests.support.wait import wait_for

VID = "VID-001"


def with_logs(gw: Gateway) -> None:
    gw.services.append(LogDownloadService(LogDownloadConfig(progress_interval_s=0.1, stall_timeout_s=30)))


class Events:
    """Every event of the vehicle as published (core NATS), from the moment `start` returns."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.seen: list[tuple[str, dict[str, Any]]] = []

    async def start(self) -> Events:
        async def on_msg(msg: Msg) -> None:
            self.seen.append((msg.subject.split(".")[5], unpack(msg.data).data))

        await self.nc.subscribe(f"fleet.{ENV}.veh.{VID}.evt.>", cb=on_msg)
        return self

    def of(self, *types: str) -> list[dict[str, Any]]:
        return [data for etype, data in self.seen if etype in types]

    async def finished(self, timeout_s: float = 40) -> dict[str, Any]:
        await wait_for(lambda: bool(self.of("log_downloaded", "log_download_failed")), timeout_s=timeout_s)
        return self.of("log_downloaded", "log_download_failed")[0]


async def test_latest_log_is_stored_byte_identical_and_set_mode_is_not_held_up(
        provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    sim = SimConfig(vehicles=1, base_port=0, speedup=5.0)
    async with command_rig(provisioned, nats_server.url, tmp_path / "state", sim=sim, configure=with_logs) as rig:
        v = rig.vehicle(VID)
        await rig.link_known(VID)
        events = await Events(rig.nc).start()
        bad = await rig.call(VID, "log_download", {"log": "9"})
        assert bad.result == "rejected" and "no log 9 (the vehicle has 1, 2)" in bad.detail
        r = await rig.call(VID, "log_download", {"log": "latest"})
        assert r.accepted, r
        held = v.logs.logs[-1]
        assert r.data["log_id"] == held.log_id and r.data["object"] == f"logs/{VID}/2-20261123T193502Z.bin"
        # A command issued during the download is not queued behind it.
        t0 = time.monotonic()
        mode = await rig.call(VID, "set_mode", {"mode": "ALT_HOLD"})
        took_s = time.monotonic() - t0
        assert mode.accepted and took_s < 1.0, (mode, took_s)
        done = await events.finished()
        assert done.get("object") == r.data["object"], done
        assert done["sha256"] == hashlib.sha256(held.data).hexdigest() and done["size_bytes"] == len(held.data)
        assert done["kib_s"] > 0
        stored = await fetch_log(rig.nc.jetstream(), ENV, *split_object(r.data["object"]))
        assert stored == held.data
        progress = events.of("log_download_progress")
        assert progress and progress[-1]["bytes"] == progress[-1]["total"] == len(held.data)
        assert [p["bytes"] for p in progress] == sorted(p["bytes"] for p in progress)


async def test_refused_while_armed(provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    async with command_rig(provisioned, nats_server.url, tmp_path / "state", configure=with_logs) as rig:
        await rig.link_known(VID)
        await rig.armed_in_guided(VID)
        r = await rig.call(VID, "log_download", {})
        assert r.result == "rejected" and "disarmed" in r.detail and "armed" in r.detail
        assert rig.vehicle(VID).logs.requests == []


async def test_resumes_after_a_link_drop_from_the_last_offset(
        provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    async with command_rig(provisioned, nats_server.url, tmp_path / "state", configure=with_logs) as rig:
        v = rig.vehicle(VID)
        await rig.link_known(VID)
        events = await Events(rig.nc).start()
        r = await rig.call(VID, "log_download", {"log": "2"})
        assert r.accepted, r
        size = len(v.logs.logs[-1].data)
        await wait_for(lambda: v.logs.frames_sent * LOG_DATA_BYTES > size // 3, timeout_s=20, interval_s=0.005)
        before = len(v.logs.requests)
        v.drop_link(2.0, close=True)  # TCP cut: the gateway reconnects
        done = await events.finished(timeout_s=60)
        assert done.get("sha256") == hashlib.sha256(v.logs.logs[-1].data).hexdigest(), done
        after = v.logs.requests[before:]
        assert after and min(ofs for _id, ofs, _n in after) > 0  # never from the start again
        assert sum(n for _id, _ofs, n in after) < size


def mavjet_logs(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mavjet.ops", "logs", *args, "--nats", url, "--env", ENV],
                          capture_output=True, text=True, timeout=120, check=False)


async def test_cli_get_shows_progress_and_writes_the_file_then_ls_lists_it(
        provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    async with command_rig(provisioned, nats_server.url, tmp_path / "state", configure=with_logs) as rig:
        await rig.link_known(VID)
        out = tmp_path / "log1.bin"
        got = await asyncio.to_thread(mavjet_logs, nats_server.url, "get", VID, "1", "--out", str(out))
        assert got.returncode == 0, got.stderr
        held = rig.vehicle(VID).logs.logs[0].data
        assert out.read_bytes() == held
        assert f"log 1 of {VID}: {len(held)}/{len(held)} bytes (100%)" in got.stderr  # progress lines (no TTY)
        assert "KiB/s" in got.stdout and hashlib.sha256(held).hexdigest()[:16] in got.stdout
        listed = await asyncio.to_thread(mavjet_logs, nats_server.url, "ls", VID, "--stored", "--json")
        rows = json.loads(listed.stdout)
        assert [r["object"] for r in rows] == [f"logs/{VID}/1-20261123T021320Z.bin"]
        assert rows[0]["bytes"] == len(held) and rows[0]["sha256"] == hashlib.sha256(held).hexdigest()
        # Without --stored: the vehicle's own list (log_list), each marked stored or not.
        onboard = await asyncio.to_thread(mavjet_logs, nats_server.url, "ls", VID, "--json")
        assert onboard.returncode == 0, onboard.stderr
        rows = json.loads(onboard.stdout)
        assert [(r["log_id"], r["stored"]) for r in rows] == [(1, True), (2, False)]
        assert rows[0]["sha256"] == hashlib.sha256(held).hexdigest() and rows[1]["sha256"] is None
        text = await asyncio.to_thread(mavjet_logs, nats_server.url, "ls", VID)
        lines = text.stdout.splitlines()  # a header, then a row per log
        assert text.returncode == 0 and "LOG" in lines[0] and "stored" in lines[1] and "2 logs" in text.stderr
        refused = await asyncio.to_thread(mavjet_logs, nats_server.url, "get", VID, "7")
        assert refused.returncode == 1 and "no log 7" in refused.stderr
