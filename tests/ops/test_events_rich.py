"""`mavjet events --follow` on a terminal: aligned, coloured rows (a real pty); piped: the same plain lines as ever."""

from __future__ import annotations

import datetime as dt
import json
import re
import sys

from nats.aio.client import Client

from mavjet.contract.envelope import CONTENT_TYPE, pack
from mavjet.contract.subjects import event_subject
from mavjet.ops.events import Severity, severity
from mavjet.ops.natsserver import NatsServer
from mavjet.ops.read import Record
from tests.ops import test_console as tty  # in_pty / piped, the console tests' own helpers

T0 = dt.datetime(2026, 11, 23, 12, 30, 0, 123000, tzinfo=dt.UTC)
SNAP = {"mode": "AUTO", "armed": True, "lat_deg": 47.3977419, "lon_deg": 8.5455938, "alt_m": 20.0,
        "battery_pct": 50.0, "flavour": "ardupilot"}
EVENTS: list[tuple[str, str, dict[str, object]]] = [
    ("VID-001", "mode_changed", {"previous_mode": "GUIDED", "custom_mode": 3}),
    ("VID-001", "failsafe", {"failsafe_type": "battery", "action_taken": "LAND", "system_status": 5}),
    ("VID-001", "cmd_result", {"cmd_id": "c1", "name": "goto", "result": "rejected", "mav_result": 2,
                               "detail": "goto rejected", "attempts": 1, "latency_ms": 41.5}),
    ("VID-0042-LONGER", "statustext", {"severity": 4, "severity_name": "WARNING", "text": "EKF variance"}),
]
# What the plain form printed before the terminal form existed, byte for byte (scripts parse it).
PLAIN = [
    "2026-11-23T12:30:00.123Z VID-001    mode_changed         previous_mode=GUIDED custom_mode=3 [AUTO 20.0m 50%]",
    "2026-11-23T12:30:01.123Z VID-001    failsafe             failsafe_type=battery action_taken=LAND "
    "system_status=CRITICAL [AUTO 20.0m 50%]",
    "2026-11-23T12:30:02.123Z VID-001    cmd_result           goto rejected in 42 ms cmd_id=c1 mav_result=2 "
    "detail=goto rejected attempts=1 [AUTO 20.0m 50%]",
    "2026-11-23T12:30:03.123Z VID-0042-LONGER statustext           severity=4 severity_name=WARNING "
    "text=EKF variance [AUTO 20.0m 50%]",
]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
RED = re.compile(r"\x1b\[[0-9;]*31m")
YELLOW = re.compile(r"\x1b\[[0-9;]*33m")


async def _publish(nc: Client) -> None:
    js = nc.jetstream()
    for i, (vid, kind, data) in enumerate(EVENTS):
        t_ns = int((T0 + dt.timedelta(seconds=i)).timestamp() * 1e9)
        await js.publish(event_subject("test", vid, kind), pack(vid, t_ns, {**SNAP, **data}),
                         headers={"Content-Type": CONTENT_TYPE, "Nats-Msg-Id": f"{vid}:{kind}:{i}"})


def _argv(server: NatsServer, *extra: str) -> list[str]:
    return [sys.executable, "-m", "mavjet.ops", "events", "--nats", server.url, "--env", "test", "--since", "1h",
            "--follow", "--duration", "1.5s", *extra]


async def test_follow_is_coloured_and_aligned_on_a_terminal_and_plain_in_a_pipe(
    provisioned: Client, nats_server: NatsServer
) -> None:
    await _publish(provisioned)
    argv = _argv(nats_server)
    rc, screen = tty.in_pty(argv, columns=160)
    assert rc == 0, screen
    lines = [line for line in screen.replace("\r", "").split("\n") if line.strip()]
    failsafe = next(line for line in lines if "failsafe_type=battery" in line)
    warning = next(line for line in lines if "EKF variance" in line)
    refused = next(line for line in lines if "goto rejected in 42 ms" in line)
    mode = next(line for line in lines if "previous_mode=GUIDED" in line)
    assert RED.search(failsafe) and not YELLOW.search(failsafe), repr(failsafe)
    assert YELLOW.search(warning) and YELLOW.search(refused) and not RED.search(warning), repr(warning)
    assert not RED.search(mode) and not YELLOW.search(mode), repr(mode)
    # columns: time, vid, type, summary, each starting at the same place on every row (the header's)
    text = [ANSI.sub("", line) for line in lines]
    header = next(line for line in text if line.startswith("TIME"))
    cols = [header.index(h) for h in ("VID", "TYPE", "SUMMARY")]
    rows = [line for line in text if line.startswith("2026-11-23T12:30:0")]
    assert len(rows) == len(EVENTS)
    for row, (vid, kind, _) in zip(rows[:-1], EVENTS[:-1], strict=True):
        assert row[cols[0]:].startswith(vid + " ") and row[cols[1]:].startswith(kind + " "), (row, cols)
        assert row[cols[2] - 1] == " " and row[cols[2]] != " "
    # an id longer than the column is shown whole: the column grows from that row on
    grown = cols[0] + len("VID-0042-LONGER") + 1
    assert rows[-1][cols[0]:].startswith("VID-0042-LONGER ") and rows[-1][grown:].startswith("statustext "), rows[-1]

    out = tty.piped(argv)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == PLAIN and "\x1b[" not in out.stdout
    # MAVJET_PLAIN=1 on a terminal: the plain lines, no colour
    rc, plain = tty.in_pty(["env", "MAVJET_PLAIN=1", *argv], columns=160)
    assert rc == 0 and "\x1b[" not in plain and PLAIN[1] in plain.replace("\r", "")
    # --json never goes through rich, terminal or not
    rc, js_screen = tty.in_pty([*argv, "--json"], columns=400)
    assert rc == 0 and "\x1b[" not in js_screen
    piped_json = tty.piped([*argv, "--json"])
    assert [json.loads(line)["type"] for line in piped_json.stdout.splitlines()] == [k for _, k, _ in EVENTS]
    assert [json.loads(line) for line in js_screen.replace("\r", "").splitlines() if line.startswith("{")] == [
        json.loads(line) for line in piped_json.stdout.splitlines()]


def _rec(kind: str, **data: object) -> Record:
    return Record(f"fleet.test.veh.VID-001.evt.{kind}", "VID-001", kind, 1, T0, dict(data))


def test_severity_of_each_kind_of_event() -> None:
    assert severity(_rec("failsafe", failsafe_type="gcs")) is Severity.CRITICAL
    assert severity(_rec("geofence_breach")) is Severity.CRITICAL
    assert [severity(_rec("statustext", severity=s)) for s in range(8)] == (
        [Severity.CRITICAL] * 4 + [Severity.WARNING] + [Severity.INFO] * 3)
    assert severity(_rec("statustext", text="no severity")) is Severity.INFO
    assert severity(_rec("link_lost", heartbeat_age_s=4.0)) is Severity.WARNING
    assert severity(_rec("cmd_result", result="timeout")) is Severity.WARNING
    assert severity(_rec("cmd_result", result="accepted")) is Severity.INFO
    assert severity(_rec("armed")) is Severity.INFO
