"""LOG_ENTRY ids: ArduPilot numbers logs from 1 (id 0 with num_logs 0 says "none"), PX4 from 0
(mavlink_log_handler.cpp: a log's id is its line in the handler's list file), so id 0 is a log whenever
num_logs > 0 (seen on PX4 SITL: its one log listed as id 0)."""

from __future__ import annotations

from mavjet.drivers.mavlink.dialect import mavlink2 as M
from mavjet.drivers.mavlink.logs import LogList
from tests.drivers.helpers import wire


def _entry(log_id: int, num_logs: int, size: int) -> object:
    return wire(M.MAVLink_log_entry_message(log_id, num_logs, max(num_logs - 1, 0), 1796455441, size))


def test_px4s_log_zero_is_listed() -> None:
    lst = LogList(target_system=1, target_component=1)
    lst.start(0.0)
    lst.on_message(_entry(0, 1, 1452759), 0.1)
    assert lst.done and [(e.log_id, e.size_bytes) for e in lst.result] == [(0, 1452759)]


def test_ardupilots_no_logs_answer_lists_nothing() -> None:
    lst = LogList(target_system=1, target_component=1)
    lst.start(0.0)
    lst.on_message(_entry(0, 0, 0), 0.1)
    assert lst.done and lst.result == []
