"""The vehicle side of the MAVLink log protocol, sans-IO, like ArduPilot.

LOG_REQUEST_LIST(start, end) → one LOG_ENTRY per log in range (a single
LOG_ENTRY with `num_logs` 0 when there are none). LOG_REQUEST_DATA(id, ofs,
count) starts a transfer that streams LOG_DATA of 90 bytes (the last one
shorter; `count` 0xFFFFFFFF: to the end) and replaces any transfer running;
a request at or past the end of the file is answered by one LOG_DATA with
`count` 0. LOG_REQUEST_END stops it. While armed the first LOG_* message is
answered with STATUSTEXT "Disarm for log download" and every request is
ignored; a transfer running when the vehicle arms pauses until it disarms.
This follows an exchange recorded against ArduCopter 4.7 SITL.

The logs are synthetic DataFlash files made once per vehicle (seeded by the
system id): FMT records describing themselves, a MSG with the firmware
string, then ATT/BARO-like records, so tools that read the header accept them.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from pymavlink.dialects.v20 import ardupilotmega as mavlink2

LOG_DATA_BYTES: Final = 90
FRAMES_PER_POLL: Final = 200  # LOG_DATA per tick (and on the request): the sim's "link rate"
DISARM_TEXT: Final = "Disarm for log download"
_HEAD: Final = b"\xa3\x95"
_FMT_TYPE: Final = 128


def _fmt(msg_type: int, length: int, name: str, fmt: str, labels: str) -> bytes:
    return _HEAD + struct.pack("<BBB4s16s64s", _FMT_TYPE, msg_type, length, name.encode(), fmt.encode(),
                               labels.encode())


def synthetic_log(seed: int, records: int) -> bytes:
    """A small DataFlash log: FMT header, a MSG, then `records` ATT records at 10 Hz."""
    rng = random.Random(seed)
    out = bytearray()
    out += _fmt(_FMT_TYPE, 89, "FMT", "BBnNZ", "Type,Length,Name,Format,Columns")
    out += _fmt(0x40, 3 + 8 + 6, "ATT", "Qccc", "TimeUS,Roll,Pitch,Yaw")
    out += _fmt(0x41, 3 + 8 + 64, "MSG", "QZ", "TimeUS,Message")
    out += _HEAD + struct.pack("<BQ64s", 0x41, 1_000_000, b"ArduCopter V4.7.0-dev (mavjet sim)")
    roll = pitch = 0.0
    yaw = rng.uniform(0, 360)
    for i in range(records):
        roll += rng.uniform(-0.5, 0.5)
        pitch += rng.uniform(-0.5, 0.5)
        yaw = (yaw + rng.uniform(-1, 1)) % 360
        out += _HEAD + struct.pack("<BQhhh", 0x40, 2_000_000 + i * 100_000, int(roll * 100), int(pitch * 100),
                                   int(yaw * 100))
    return bytes(out)


@dataclass(frozen=True, slots=True)
class SimLog:
    log_id: int
    time_utc_s: int
    data: bytes


def default_logs(sysid: int) -> list[SimLog]:
    """Two logs per vehicle: a short one and a longer, later one (~60 kB and ~330 kB)."""
    return [
        SimLog(1, 1_795_400_000, synthetic_log(sysid * 1000 + 1, 3_000)),
        SimLog(2, 1_795_462_502, synthetic_log(sysid * 1000 + 2, 17_000)),
    ]


@dataclass(slots=True)
class _Transfer:
    log: SimLog
    next_ofs: int
    end_ofs: int


@dataclass(slots=True)
class LogServer:
    """Serves the vehicle's logs; `requests` records every LOG_REQUEST_DATA as (id, ofs, count) for tests.

    The logs are made on first use (`make_logs`): a fleet of thousands of
    vehicles that never lists its logs does not pay ~350 kB and 20 ms each.
    """

    make_logs: Callable[[], list[SimLog]] = list
    requests: list[tuple[int, int, int]] = field(default_factory=list)
    frames_sent: int = 0
    _transfer: _Transfer | None = None
    _logs: list[SimLog] | None = None
    _warned: bool = False  # "Disarm for log download" said during this armed period

    @property
    def logs(self) -> list[SimLog]:
        if self._logs is None:
            self._logs = self.make_logs()
        return self._logs

    @property
    def active(self) -> bool:
        return self._transfer is not None

    def _by_id(self, log_id: int) -> SimLog | None:
        return next((lg for lg in self.logs if lg.log_id == log_id), None)

    def warn_armed(self, armed: bool) -> bool:
        """Whether a LOG_* message now gets "Disarm for log download" (once per armed period)."""
        if not armed:
            self._warned = False
            return False
        warn, self._warned = not self._warned, True
        return warn

    def on_request_list(self, msg: Any) -> list[Any]:
        if self._transfer is not None:  # AP_Logger: one transfer at a time; a list meanwhile gets only this text
            return [mavlink2.MAVLink_statustext_message(mavlink2.MAV_SEVERITY_INFO, b"Log download in progress")]
        if not self.logs:
            return [mavlink2.MAVLink_log_entry_message(0, 0, 0, 0, 0)]
        last = max(lg.log_id for lg in self.logs)
        lo, hi = int(msg.start), int(msg.end)
        return [mavlink2.MAVLink_log_entry_message(lg.log_id, len(self.logs), last, lg.time_utc_s, len(lg.data))
                for lg in self.logs if lo <= lg.log_id <= hi]

    def on_request_data(self, msg: Any) -> list[Any]:
        log_id, ofs, count = int(msg.id), int(msg.ofs), int(msg.count)
        self.requests.append((log_id, ofs, count))
        log = self._by_id(log_id)
        if log is None:
            self._transfer = None
            return []
        size = len(log.data)
        if ofs >= size:
            self._transfer = None
            return [mavlink2.MAVLink_log_data_message(log_id, ofs, 0, bytes(LOG_DATA_BYTES))]
        self._transfer = _Transfer(log, ofs, min(size, ofs + count))
        return self.poll(armed=False)

    def on_request_end(self) -> list[Any]:
        self._transfer = None
        return []

    def poll(self, *, armed: bool) -> list[Any]:
        """The next LOG_DATA frames of the running transfer (none while armed: it pauses)."""
        t = self._transfer
        if t is None or armed:
            return []
        out: list[Any] = []
        while t.next_ofs < t.end_ofs and len(out) < FRAMES_PER_POLL:
            chunk = t.log.data[t.next_ofs : min(t.next_ofs + LOG_DATA_BYTES, t.end_ofs)]
            out.append(mavlink2.MAVLink_log_data_message(t.log.log_id, t.next_ofs, len(chunk),
                                                         chunk.ljust(LOG_DATA_BYTES, b"\0")))
            t.next_ofs += len(chunk)
        if t.next_ofs >= t.end_ofs:
            self._transfer = None
        self.frames_sent += len(out)
        return out
