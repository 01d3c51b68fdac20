"""`mavjet events`: --since/--until in every accepted form and --json, against a real nats-server."""

from __future__ import annotations

import datetime as dt
import json
import signal
import subprocess
import sys
import time

import anyio
import pytest
from nats.aio.client import Client

from mavjet.contract.envelope import CONTENT_TYPE, pack
from mavjet.contract.subjects import event_subject
from mavjet.contract.units import parse_instant
from mavjet.ops.natsserver import NatsServer

NOW = dt.datetime(2026, 11, 23, 12, 30, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("now", NOW),
        ("today", dt.datetime(2026, 11, 23, tzinfo=dt.UTC)),
        ("yesterday", dt.datetime(2026, 11, 22, tzinfo=dt.UTC)),
        ("10m", NOW - dt.timedelta(minutes=10)),
        ("90s ago", NOW - dt.timedelta(seconds=90)),
        ("7d", NOW - dt.timedelta(days=7)),
        ("15", NOW - dt.timedelta(seconds=15)),
        ("2026-11-20T10:00", dt.datetime(2026, 11, 20, 10, tzinfo=dt.UTC)),
        ("2026-11-20", dt.datetime(2026, 11, 20, tzinfo=dt.UTC)),
        ("2026-11-20T10:00:00Z", dt.datetime(2026, 11, 20, 10, tzinfo=dt.UTC)),
        ("2026-11-20T12:00+02:00", dt.datetime(2026, 11, 20, 10, tzinfo=dt.UTC)),
        ("1763900000", dt.datetime.fromtimestamp(1763900000, tz=dt.UTC)),
    ],
)
def test_parse_instant_accepts_what_people_type(text: str, expected: dt.datetime) -> None:
    assert parse_instant(text, now=NOW) == expected


@pytest.mark.parametrize("text", ["bogus", "", "10 parsecs", "2026-13-01"])
def test_parse_instant_refuses_with_the_accepted_forms(text: str) -> None:
    with pytest.raises(ValueError, match="yesterday"):
        parse_instant(text, now=NOW)


def _events(server: NatsServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mavjet.ops", "events", "--nats", server.url, "--env", "test", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )


async def test_since_until_and_json_select_the_window(provisioned: Client, nats_server: NatsServer) -> None:
    js = provisioned.jetstream()
    now = dt.datetime.now(dt.UTC)
    # --since starts the consumer at a stream time; --until is applied to each event's own time.
    for i in range(3):
        data = {"severity": 6, "text": f"line {i}"}
        await js.publish(event_subject("test", "VID-001", "statustext"), pack("VID-001", int(now.timestamp() * 1e9), data),
                         headers={"Content-Type": CONTENT_TYPE, "Nats-Msg-Id": f"VID-001:statustext:{i}"})
    out = _events(nats_server, "--since", "yesterday", "--json")
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["data"]["text"] for r in lines] == ["line 0", "line 1", "line 2"]
    assert {r["vid"] for r in lines} == {"VID-001"} and {r["type"] for r in lines} == {"statustext"}
    # --until before anything was stored: nothing printed, exit 0.
    out = _events(nats_server, "--since", "yesterday", "--until", (now - dt.timedelta(minutes=5)).isoformat())
    assert out.returncode == 0 and out.stdout == "", out.stdout + out.stderr


@pytest.mark.parametrize(
    ("args", "key"),
    [(("--since", "tomorrowish"), "since"), (("--since", "1h", "--until", "2h"), "until"),
     (("--since", "1h", "--until", "now", "--follow"), "until")],
)
async def test_bad_times_exit_2_with_one_line(nats_server: NatsServer, args: tuple[str, ...], key: str) -> None:
    out = _events(nats_server, *args)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and key in out.stderr, out.stderr


async def test_a_closed_pipe_is_not_a_traceback(provisioned: Client, nats_server: NatsServer) -> None:
    js = provisioned.jetstream()
    now_ns = dt.datetime.now(dt.UTC).timestamp() * 1e9
    for i in range(300):
        await js.publish(event_subject("test", "VID-001", "statustext"),
                         pack("VID-001", int(now_ns), {"severity": 6, "text": f"line {i} " + "x" * 200}),
                         headers={"Content-Type": CONTENT_TYPE, "Nats-Msg-Id": f"VID-001:statustext:p{i}"})
    # `twin` prints everything at once after reading: the write hits the closed pipe in the command itself.
    cmd = f"{sys.executable} -m mavjet.ops twin VID-001 --events 300 --nats {nats_server.url} --env test | head -n 1"
    out = await anyio.to_thread.run_sync(lambda: subprocess.run(
        ["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, timeout=60, check=False))
    assert out.stdout.count("\n") == 1 and "VID-001" in out.stdout
    assert "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr, out.stderr
    assert out.returncode == 0, out.stderr


async def test_follow_ends_when_its_reader_goes_away_even_with_nothing_to_print(
        provisioned: Client, nats_server: NatsServer) -> None:
    """`mavjet events --follow | head -2`: head exits, and so does mavjet, at once (exit 0),
    though no event comes to be written into the closed pipe."""
    js = provisioned.jetstream()
    now_ns = dt.datetime.now(dt.UTC).timestamp() * 1e9
    for i in range(2):
        await js.publish(event_subject("test", "VID-001", "statustext"),
                         pack("VID-001", int(now_ns), {"severity": 6, "text": f"line {i}"}),
                         headers={"Content-Type": CONTENT_TYPE, "Nats-Msg-Id": f"VID-001:statustext:f{i}"})
    cmd = (f"{sys.executable} -m mavjet.ops events --follow --since 1h --nats {nats_server.url} --env test"
           " | head -n 2")

    def pipeline() -> tuple[subprocess.CompletedProcess[str], float]:
        started = time.monotonic()
        out = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, timeout=60,
                             check=False)
        return out, time.monotonic() - started

    out, took_s = await anyio.to_thread.run_sync(pipeline)
    assert out.stdout.count("\n") == 2 and "line 1" in out.stdout, out.stdout
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert took_s < 15, took_s  # it used to follow an empty subject until the timeout killed it


async def test_ctrl_c_on_follow_exits_130(provisioned: Client, nats_server: NatsServer) -> None:
    argv = [sys.executable, "-m", "mavjet.ops", "events", "--follow", "--nats", nats_server.url, "--env", "test"]
    async with await anyio.open_process(argv, stdout=subprocess.DEVNULL) as proc:
        await anyio.sleep(3)  # connected and following (a start-up Ctrl-C is the same exit)
        proc.send_signal(signal.SIGINT)
        with anyio.fail_after(30):
            rc = await proc.wait()
        assert proc.stderr is not None
        err = b"".join([chunk async for chunk in proc.stderr]).decode(errors="replace")
    assert rc == 130 and "Traceback" not in err, err
