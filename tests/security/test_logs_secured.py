"""Flight-log download end to end under the generated auth.

A real gateway process on VID-001's credential downloads a log from its sim
vehicle into TWIN_LOGS (which that credential may write only under its own
subjects); `mavjet logs` with the operator's credential lists the vehicle's
logs and fetches the stored one byte-identical. Nobody trips a permission.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mavjet.sim.fleet import SimConfig, SimFleet
from tests.security.conftest import ENV, Secured
from tests.support.gwprocess import gateway_process, state_published

pytestmark = pytest.mark.timeout(180)


def mavjet_logs(hub: Secured, creds: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mavjet.ops", "logs", *args, "--nats", hub.server.url, "--env", ENV,
                           "--creds", hub.creds(creds)], capture_output=True, text=True, timeout=150, check=False)


async def test_log_download_under_auth_is_byte_identical(hub: Secured, tmp_path: Path) -> None:
    log = tmp_path / "gateway.log"
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=5.0)) as fleet, gateway_process(
            vid="VID-001", endpoint=fleet.endpoints[0], url=hub.server.url, env=ENV, creds=hub.creds("VID-001"),
            state_dir=tmp_path / "state", instance="secured-logs", log=log):
        admin = await hub.connect("admin")
        try:
            await state_published(admin.jetstream(), ENV, "VID-001")
            held = fleet.vehicles[0].logs.logs
            listed = await asyncio.to_thread(mavjet_logs, hub, "operator", "ls", "VID-001", "--json")
            assert listed.returncode == 0, listed.stderr
            rows = json.loads(listed.stdout)
            assert [(r["log_id"], r["size_bytes"], r["stored"]) for r in rows] == [
                (lg.log_id, len(lg.data), False) for lg in held]

            dest = tmp_path / "log2.bin"
            got = await asyncio.to_thread(mavjet_logs, hub, "operator", "get", "VID-001", "latest", "--out", str(dest),
                                          "--json")
            assert got.returncode == 0, got.stderr
            assert dest.read_bytes() == held[-1].data
            out = json.loads(got.stdout)
            assert out["sha256"] == out["file_sha256"] == hashlib.sha256(held[-1].data).hexdigest()
            print(f"log download under auth: {out['size_bytes']} bytes at {out['kib_s']} KiB/s")

            stored = await asyncio.to_thread(mavjet_logs, hub, "operator", "ls", "VID-001", "--stored", "--json")
            assert [r["object"] for r in json.loads(stored.stdout)] == [out["object"]]
            listed = await asyncio.to_thread(mavjet_logs, hub, "operator", "ls", "VID-001", "--json")
            assert [r["stored"] for r in json.loads(listed.stdout)] == [False, True]
            # The viewer has no log permission: refused, with a clear line and no traceback.
            viewer = await asyncio.to_thread(mavjet_logs, hub, "viewer", "ls", "VID-001", "--stored")
            assert viewer.returncode != 0 and "Traceback" not in viewer.stderr
        finally:
            await admin.close()
    text = log.read_text()
    assert "permissions violation" not in text.lower(), text[-3000:]
    violations = [ln for ln in hub.log().splitlines() if "Violation" in ln]
    assert all("viewer" in ln or "_INBOX_viewer" in ln or "TWIN_LOGS" in ln for ln in violations), violations
