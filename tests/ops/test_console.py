"""Rich on a terminal, the stable plain text in a pipe: the same command run both ways (a real pty)."""

from __future__ import annotations

import datetime as dt
import fcntl
import io
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

from nats.aio.client import Client

from mavjet.contract.envelope import CONTENT_TYPE, pack
from mavjet.contract.subjects import state_subject
from mavjet.ops.console import LineProgress, plain_table, transfer_progress
from mavjet.ops.natsserver import NatsServer

VID = "VID-004"
DEMO_PLAN = Path(__file__).resolve().parents[2] / "sim" / "plans" / "demo.plan"
BOX = "─"  # rich's SIMPLE_HEAD rule under the header


def in_pty(argv: list[str], *, columns: int = 120, lines: int = 40, timeout_s: float = 60.0) -> tuple[int, str]:
    """Run argv with stdin/stdout/stderr on a pseudo-terminal of the given size; its exit code and output."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(columns), "LINES": str(lines)}
    env.pop("MAVJET_PLAIN", None)
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    return rc, b"".join(chunks).decode("utf-8", "replace")


def piped(argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "MAVJET_PLAIN"}
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, env=env)


async def _publish_state(nc: Client) -> None:
    js = nc.jetstream()
    now_ns = int(dt.datetime.now(dt.UTC).timestamp() * 1e9)
    for channel, data in (("position", {"lat_deg": 47.3977419, "lon_deg": 8.5455938, "alt_m": 12.34}),
                          ("status", {"mode": "GUIDED", "armed": True, "landed_state": 2})):
        await js.publish(state_subject("test", VID, channel), pack(VID, now_ns, data),
                         headers={"Content-Type": CONTENT_TYPE})


async def test_twin_is_a_rich_table_on_a_terminal_and_plain_in_a_pipe(
    provisioned: Client, nats_server: NatsServer
) -> None:
    await _publish_state(provisioned)
    argv = [sys.executable, "-m", "mavjet.ops", "twin", VID, "--nats", nats_server.url, "--env", "test"]
    rc, screen = in_pty(argv)
    assert rc == 0, screen
    assert "CHANNEL" in screen and "FIELDS" in screen and BOX in screen, screen  # a rich table
    assert "lat_deg=47.3977419" in screen and "landed_state=IN_AIR" in screen
    out = piped(argv)
    assert out.returncode == 0, out.stderr
    assert "\x1b[" not in out.stdout and BOX not in out.stdout and "CHANNEL" not in out.stdout
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"{VID} (test)  STALE: no gateway record")  # no gateway published here
    assert any(line.startswith("  position ") and "lat_deg=47.3977419" in line for line in lines)
    # MAVJET_PLAIN forces the plain form on a terminal too
    rc, plain = in_pty(["env", "MAVJET_PLAIN=1", *argv])
    assert rc == 0 and BOX not in plain and "  position " in plain


async def test_monitor_once_tables_on_a_terminal(provisioned: Client, nats_server: NatsServer) -> None:
    argv = [sys.executable, "-m", "mavjet.ops", "monitor", "--once", "--nats", nats_server.url]
    rc, screen = in_pty(argv)
    assert rc in (0, 1), screen
    assert "STREAM" in screen and "TWIN_STATE" in screen and BOX in screen
    out = piped(argv)
    assert out.stdout.startswith("streams:\n") and BOX not in out.stdout


def test_cmd_list_on_a_terminal_is_a_table() -> None:
    rc, screen = in_pty([sys.executable, "-m", "mavjet.ops", "cmd", "--list"])
    assert rc == 0 and "WHAT IT DOES" in screen and "takeoff" in screen and BOX in screen


def test_progress_is_plain_lines_off_a_terminal_and_a_bar_on_one() -> None:
    buf = io.StringIO()
    with transfer_progress("get x", stream=buf) as progress:
        assert isinstance(progress, LineProgress)
        for done in range(0, 1001, 50):
            progress(done, 1000)
    lines = buf.getvalue().splitlines()
    assert lines[0] == "get x: 0/1000 bytes (0%)" and lines[-1] == "get x: 1000/1000 bytes (100%)"
    assert len(lines) == 11  # one per tenth, not one per call
    quiet = io.StringIO()
    with transfer_progress("get x", stream=quiet, quiet=True) as progress:
        progress(1, 2)
    assert quiet.getvalue() == ""
    code = ("from mavjet.ops.console import transfer_progress\n"
            "with transfer_progress('put big.bin') as p:\n"
            "    for i in range(11): p(i * 100_000, 1_000_000)\n"
            "print('done')\n")
    rc, screen = in_pty([sys.executable, "-c", code])
    assert rc == 0 and "put big.bin" in screen and "done" in screen
    assert "━" in screen and "bytes (" not in screen  # a bar, not the plain lines


def test_plain_table_pads_columns() -> None:
    assert plain_table(["A", "BB"], [["xyz", "1"], ["q", "22"]]).splitlines() == ["A    BB", "xyz  1", "q    22"]


ANSI = re.compile(r"\x1b(\[[0-9;?]*[A-Za-z]|\][^\x07]*\x07|[()][0-9A-Za-z]|[=>78])")


async def test_fleet_live_view_redraws_in_the_alternate_screen_within_80x24(
    provisioned: Client, nats_server: NatsServer
) -> None:
    await _publish_state(provisioned)
    argv = [sys.executable, "-m", "mavjet.ops", "fleet", "--nats", nats_server.url, "--env", "test",
            "--refresh", "0.3s", "--duration", "1.5s"]
    rc, screen = in_pty(argv, columns=80, lines=24)
    assert rc == 0, screen
    assert "\x1b[?1049h" in screen and "\x1b[?1049l" in screen  # entered and restored the screen
    text = ANSI.sub("\n", screen.replace("\r", ""))
    assert VID in text and "VEHICLE" in text and "EVENTS" in text
    assert max(len(line) for line in text.split("\n")) <= 80
    after = ANSI.sub("", screen.rsplit("\x1b[?1049l", 1)[1])
    assert VID in after and "VEHICLE" in after  # --duration ran out: the last frame stays on screen


async def test_blobs_put_progress_and_ls_table(provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    blob = tmp_path / "big.bin"
    blob.write_bytes(os.urandom(600_000))
    nats = ["--nats", nats_server.url]
    out = piped([sys.executable, "-m", "mavjet.ops", "blobs", "put", str(blob), "--name", "logs/VID-004/1.bin", *nats])
    assert out.returncode == 0, out.stderr
    assert "put big.bin: 600000/600000 bytes (100%)" in out.stderr  # plain lines off a terminal
    again = tmp_path / "again.bin"
    again.write_bytes(os.urandom(300_000))
    rc, screen = in_pty([sys.executable, "-m", "mavjet.ops", "blobs", "put", str(again), *nats])
    assert rc == 0 and "stored sha256/" in screen and "bytes (" not in screen, screen  # the bar, then the result
    rc, screen = in_pty([sys.executable, "-m", "mavjet.ops", "blobs", "ls", *nats])
    assert rc == 0 and "OBJECT" in screen and BOX in screen and "-> sha256/" in screen, screen
    assert "logs/VID-004/1.bin" in screen and "600,000" in screen
    out = piped([sys.executable, "-m", "mavjet.ops", "blobs", "ls", *nats])
    assert "OBJECT" not in out.stdout and any(
        line.startswith("logs/VID-004/1.bin") and "600000 B" in line for line in out.stdout.splitlines())


async def test_mission_ls_is_a_table_on_a_terminal(provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    plan = DEMO_PLAN
    nats = ["--nats", nats_server.url]
    out = piped([sys.executable, "-m", "mavjet.ops", "mission", "put", str(plan), "--name", "missions/tty.plan", *nats])
    assert out.returncode == 0, out.stderr
    rc, screen = in_pty([sys.executable, "-m", "mavjet.ops", "mission", "ls", *nats])
    assert rc == 0 and "OBJECT" in screen and BOX in screen and "missions/tty.plan" in screen, screen
    out = piped([sys.executable, "-m", "mavjet.ops", "mission", "ls", *nats])
    assert "OBJECT" not in out.stdout and any(line.startswith("missions/tty.plan") for line in out.stdout.splitlines())
