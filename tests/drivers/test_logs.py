"""The sans-IO log machines: listing, windows, gap detection and re-requests, end of file, timeouts."""

from __future__ import annotations

import pytest

from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.drivers.mavlink.logs import LOG_DATA_BYTES, LogConfig, LogList, LogTimeout, LogWindow

SYS = 1
CFG = LogConfig(silence_s=1.0, max_attempts=3, window_bytes=900)
FILE = bytes(range(256)) * 10  # 2560 bytes: 28 full frames and one of 40


def frame(ofs: int, data: bytes = FILE, log_id: int = 7) -> object:
    chunk = data[ofs : ofs + LOG_DATA_BYTES]
    msg = mavlink2.MAVLink_log_data_message(log_id, ofs, len(chunk), chunk.ljust(LOG_DATA_BYTES, b"\0"))
    msg._header = mavlink2.MAVLink_header(msg.id, srcSystem=SYS, srcComponent=1)
    return msg


def window(offset: int = 0, count: int = 900) -> LogWindow:
    return LogWindow(log_id=7, offset=offset, count=count, target_system=SYS, target_component=1, config=CFG)


def req(msgs: list[object]) -> list[tuple[int, int]]:
    return [(int(m.ofs), int(m.count)) for m in msgs]  # type: ignore[attr-defined]


def test_a_window_in_one_burst() -> None:
    w = window()
    assert req(w.start(0.0)) == [(0, 900)]
    for ofs in range(0, 900, 90):
        assert w.on_message(frame(ofs), 0.1) == []
    assert w.done and w.error is None and w.contiguous() == FILE[:900] and w.requests == 1


def test_holes_are_asked_for_as_one_span_when_the_burst_ends() -> None:
    w = window()
    w.start(0.0)
    out: list[object] = []
    for ofs in range(0, 900, 90):
        if ofs not in (180, 540):
            out = w.on_message(frame(ofs), 0.1)
    assert w.missing() == [(180, 270), (540, 630)]
    assert w.contiguous() == FILE[:180]
    assert req(out) == [(180, 450)]  # at once, without waiting for a silence
    w.on_message(frame(180), 0.2)
    assert not w.done
    w.on_message(frame(540), 0.2)
    assert w.done and w.contiguous() == FILE[:900]


def test_a_lost_last_frame_is_asked_for_after_the_silence() -> None:
    w = window()
    w.start(0.0)
    for ofs in range(0, 810, 90):
        w.on_message(frame(ofs), 0.1)
    assert w.on_tick(0.5) == []
    assert req(w.on_tick(1.2)) == [(810, 90)]


def test_the_end_of_the_file_ends_the_window_early() -> None:
    w = window(offset=1800, count=900)
    w.start(0.0)
    for ofs in range(1800, 2560, 90):
        w.on_message(frame(ofs), 0.1)
    assert w.eof_offset == 2560 and w.done and w.contiguous() == FILE[1800:]


def test_an_empty_frame_past_the_end() -> None:
    w = window(offset=2560, count=90)
    w.start(0.0)
    empty = mavlink2.MAVLink_log_data_message(7, 2560, 0, bytes(90))
    empty._header = mavlink2.MAVLink_header(empty.id, srcSystem=SYS, srcComponent=1)
    w.on_message(empty, 0.1)
    assert w.done and w.contiguous() == b"" and w.eof_offset == 2560


def test_other_logs_and_systems_are_ignored() -> None:
    w = window()
    w.start(0.0)
    w.on_message(frame(0, log_id=8), 0.1)
    other = frame(0)
    other._header = mavlink2.MAVLink_header(other.id, srcSystem=9, srcComponent=1)  # type: ignore[attr-defined]
    w.on_message(other, 0.1)
    assert w.missing() == [(0, 900)]


def test_silence_gives_up_with_the_offset_to_resume_from() -> None:
    w = window()
    w.start(0.0)
    for ofs in (0, 90, 270):
        w.on_message(frame(ofs), 0.1)
    now = 0.1
    while not w.done:
        now += 1.1
        w.on_tick(now)
    assert isinstance(w.error, LogTimeout) and w.error.offset_bytes == 180 and w.contiguous() == FILE[:180]


def test_progress_resets_the_attempts() -> None:
    w = window()
    w.start(0.0)
    now = 0.0
    for ofs in range(0, 900, 90):
        now += 1.1
        w.on_tick(now)  # a silence before every frame: a slow link, not a dead one
        w.on_message(frame(ofs), now)
    assert w.done and w.error is None


def entry(log_id: int, num: int) -> object:
    msg = mavlink2.MAVLink_log_entry_message(log_id, num, num, 1_700_000_000 + log_id, 1000 * log_id)
    msg._header = mavlink2.MAVLink_header(msg.id, srcSystem=SYS, srcComponent=1)
    return msg


def test_list_collects_every_entry() -> None:
    m = LogList(target_system=SYS, target_component=1, config=CFG)
    sent = m.start(0.0)
    assert sent[0].get_type() == "LOG_REQUEST_LIST" and (sent[0].start, sent[0].end) == (0, 0xFFFF)
    m.on_message(entry(2, 2), 0.1)
    assert not m.done
    m.on_message(entry(1, 2), 0.1)
    assert m.done and [(e.log_id, e.size_bytes) for e in m.result] == [(1, 1000), (2, 2000)]


def test_list_of_none_and_a_silent_vehicle() -> None:
    m = LogList(target_system=SYS, target_component=1, config=CFG)
    m.start(0.0)
    m.on_message(entry(0, 0), 0.1)
    assert m.done and m.result == []
    m = LogList(target_system=SYS, target_component=1, config=CFG)
    m.start(0.0)
    assert len(m.on_tick(1.1)) == 1 and len(m.on_tick(2.2)) == 1
    m.on_tick(3.3)
    assert isinstance(m.error, LogTimeout)


def test_config_is_checked() -> None:
    with pytest.raises(ValueError):
        LogConfig(window_bytes=10)
