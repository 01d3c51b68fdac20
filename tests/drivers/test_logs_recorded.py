"""The log machines against frames ArduCopter 4.7 SITL really sent (tests/drivers/fixtures/ardupilot_log_download.json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.drivers.mavlink.logs import LogConfig, LogList, LogWindow

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "ardupilot_log_download.json").read_text())
CFG = LogConfig(silence_s=1.0, max_attempts=3, window_bytes=900)


def frames(direction: str, mtype: str) -> list[Any]:
    parser = mavlink2.MAVLink(None)
    parser.robust_parsing = True
    out: list[Any] = []
    for row in FIXTURE["frames"]:
        msgs = parser.parse_buffer(bytes.fromhex(row["hex"])) or []
        out += [m for m in msgs if row["dir"] == direction and m.get_type() == mtype]
    return out


def window(offset: int, count: int) -> LogWindow:
    return LogWindow(log_id=1, offset=offset, count=count, target_system=1, target_component=1, config=CFG)


def feed(w: LogWindow, msgs: list[Any]) -> None:
    w.start(0.0)
    for m in msgs:
        w.on_message(m, 0.1)


def test_the_list_gives_the_size_the_download_had() -> None:
    lst = LogList(target_system=1, target_component=1, config=CFG)
    lst.start(0.0)
    for m in frames("from_vehicle", "LOG_ENTRY"):
        lst.on_message(m, 0.1)
    assert lst.done and [(e.log_id, e.size_bytes) for e in lst.result] == [(1, FIXTURE["log_size_bytes"])]


def test_each_recorded_reply_completes_its_request() -> None:
    data = frames("from_vehicle", "LOG_DATA")
    requests = [(r.ofs, r.count) for r in frames("to_vehicle", "LOG_REQUEST_DATA")]
    assert requests == [(0, 0xFFFFFFFF), (0, 900), (1000, 100), (0, 90), (4165070, 900), (4165120, 90)]
    first = [m for m in data if m.ofs < 900][:10]
    w = window(0, 900)
    feed(w, first)
    assert w.done and len(w.contiguous()) == 900 and w.contiguous()[:8].hex() == "a395808059464d54"
    w = window(1000, 100)
    feed(w, [m for m in data if m.ofs in (1000, 1090)])
    assert w.done and len(w.contiguous()) == 100  # 90 + 10: a request's count is honoured exactly
    assert w.eof_offset is None  # ... and its short last frame is not the end of the file
    w = window(4165070, 900)
    feed(w, [m for m in data if m.ofs == 4165070])
    assert w.done and len(w.contiguous()) == 50 and w.eof_offset == FIXTURE["log_size_bytes"]
    w = window(4165120, 90)
    feed(w, [m for m in data if m.ofs == 4165120])
    assert w.done and w.contiguous() == b"" and w.eof_offset == FIXTURE["log_size_bytes"]  # count 0: past the end
