"""A change of --workers is refused while the old layout's state dirs hold spooled events or recent commands."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from mavjet.contract.errors import ConfigError
from mavjet.gateway.commands.consumer import LEDGER_FILE
from mavjet.gateway.commands.ledger import Ledger, LedgerEntry, in_flight_entry
from mavjet.gateway.publish.spool import Spool
from mavjet.gateway.runtime.layout import LAYOUT_FILE, REDELIVERY_HORIZON_S, check_layout

NOW_NS = time.time_ns()


def final(cmd_id: str, at_ns: int) -> LedgerEntry:
    return LedgerEntry(cmd_id=cmd_id, vid="VID-001", name="arm", result="accepted", subject="s", msg_id="m",
                       payload=b"x", spooled=False, at_ns=at_ns)


async def record(d: Path, entry: LedgerEntry) -> None:
    await anyio.Path(d).mkdir(parents=True, exist_ok=True)
    ledger = Ledger(d / LEDGER_FILE)
    await ledger.open()
    try:
        assert await ledger.record(entry)
    finally:
        ledger.close()


def test_first_start_records_the_layout_and_the_same_n_is_fine(tmp_path: Path) -> None:
    check_layout(tmp_path, 2)
    assert json.loads((tmp_path / LAYOUT_FILE).read_text()) == {"workers": 2}
    check_layout(tmp_path, 2)
    check_layout(tmp_path, 1)  # nothing stored anywhere: the change is safe
    assert json.loads((tmp_path / LAYOUT_FILE).read_text()) == {"workers": 1}


def test_spooled_events_in_an_old_worker_dir_refuse_the_change(tmp_path: Path) -> None:
    check_layout(tmp_path, 2)
    (tmp_path / "worker-1").mkdir()
    spool = Spool(tmp_path / "worker-1" / "spool.sqlite", max_entries=100)
    spool.append_sync([("fleet.t.veh.VID-002.evt.armed", "id-1", b"payload")])
    spool.close()
    with pytest.raises(ConfigError, match=r"last run with --workers 2 .*worker-1 still holds 1 unsent events"):
        check_layout(tmp_path, 3)
    assert json.loads((tmp_path / LAYOUT_FILE).read_text()) == {"workers": 2}  # unchanged
    check_layout(tmp_path, 2)  # the old layout may always start, and drain


async def test_a_command_in_flight_or_recent_refuses_an_old_one_does_not(tmp_path: Path) -> None:
    check_layout(tmp_path, 1)
    await record(tmp_path, in_flight_entry("VID-001", "c1", "arm", NOW_NS))
    with pytest.raises(ConfigError, match="command"):
        check_layout(tmp_path, 2, now_ns=NOW_NS + int(3600e9))  # in flight: however old
    other = tmp_path / "other"
    check_layout(other, 1)
    await record(other, final("c2", NOW_NS))
    with pytest.raises(ConfigError, match="command"):
        check_layout(other, 2, now_ns=NOW_NS + int(10e9))  # TWIN_CMD could still redeliver it
    check_layout(other, 2, now_ns=NOW_NS + int((REDELIVERY_HORIZON_S + 1) * 1e9))
    assert json.loads((other / LAYOUT_FILE).read_text()) == {"workers": 2}


def test_the_gateway_exits_2_with_one_line(tmp_path: Path) -> None:
    state = tmp_path / "state"
    check_layout(state, 1)
    spool = Spool(state / "spool.sqlite", max_entries=100)
    spool.append_sync([("fleet.t.veh.VID-001.evt.armed", "id-1", b"payload")])
    spool.close()
    out = subprocess.run(
        [sys.executable, "-m", "mavjet.ops", "gateway", "--nats", "nats://127.0.0.1:1", "--env", "t",
         "--vehicle", "VID-001=tcp:127.0.0.1:9", "--vehicle", "VID-002=tcp:127.0.0.1:19",
         "--state-dir", str(state), "--workers", "2", "--metrics-port", "0"],
        capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "last run with --workers 1" in lines[0], out.stderr
