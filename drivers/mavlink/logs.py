"""Sans-IO flight-log protocol: LOG_REQUEST_LIST → LOG_ENTRY, LOG_REQUEST_DATA → LOG_DATA.

Why machines of their own: the log protocol has no ACK and no flow control.
ArduPilot answers one LOG_REQUEST_DATA(ofs, count) with a burst of LOG_DATA
of 90 bytes each (the last one shorter, a `count` of 0 past the end of the
file) and says nothing when a frame is lost, so the receiver finds the holes
itself and asks for exactly those byte ranges again. While armed ArduPilot
answers the first LOG_* message with STATUSTEXT "Disarm for log download" and
ignores the rest: to this machine that is silence, and the caller checks the
armed state before it starts.

A download is a sequence of windows (`LogWindow`, `window_bytes` each): the
caller runs one window at a time, keeps the bytes that came in order, and
starts the next window at the first byte it does not have. That is also
resuming: after a link drop the next request starts at the last received
offset, never at 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from mavjet.contract.errors import MavjetError
from mavjet.drivers.mavlink.dialect import MavMessage, mavlink2

LOG_DATA_BYTES = 90  # payload of one LOG_DATA frame
LOG_REQUEST_ALL = 0xFFFFFFFF  # `count` meaning: to the end of the file


class LogError(MavjetError):
    """A log operation failed; `log_id` is 0 for the listing."""

    def __init__(self, log_id: int, reason: str) -> None:
        super().__init__(f"log {log_id}: {reason}" if log_id else f"log list: {reason}")
        self.log_id = log_id
        self.reason = reason


class LogTimeout(LogError):
    """No answer after every attempt; bytes before `offset_bytes` were received (resume there)."""

    def __init__(self, log_id: int, attempts: int, offset_bytes: int = 0) -> None:
        super().__init__(log_id, f"no answer after {attempts} attempts (received up to byte {offset_bytes})")
        self.attempts = attempts
        self.offset_bytes = offset_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class LogConfig:
    silence_s: float = 0.5  # no LOG_* frame for this long: the burst ended or was lost
    max_attempts: int = 10  # requests in a row without a single new byte before giving up
    window_bytes: int = LOG_DATA_BYTES * 256  # bytes per window (the transfer lock is held per window)

    def __post_init__(self) -> None:
        if self.silence_s <= 0 or self.max_attempts < 1 or self.window_bytes < LOG_DATA_BYTES:
            raise ValueError(f"invalid LogConfig {self}")


DEFAULT_LOG_CONFIG = LogConfig()


@dataclass(frozen=True, slots=True, kw_only=True)
class LogEntry:
    """One log the autopilot holds (LOG_ENTRY)."""

    log_id: int
    num_logs: int
    last_log_num: int
    time_utc_s: int  # 0 when the autopilot had no UTC time when the log started
    size_bytes: int


def entry_of(msg: MavMessage) -> LogEntry:
    return LogEntry(log_id=int(msg.id), num_logs=int(msg.num_logs), last_log_num=int(msg.last_log_num),
                    time_utc_s=int(msg.time_utc), size_bytes=int(msg.size))


def request_end(target_system: int, target_component: int) -> MavMessage:
    """LOG_REQUEST_END: the autopilot may resume logging (ArduPilot stops while a transfer is open)."""
    return mavlink2.MAVLink_log_request_end_message(target_system, target_component)


@dataclass(slots=True, kw_only=True)
class LogList:
    """LOG_REQUEST_LIST → every LOG_ENTRY; re-requested on silence until all `num_logs` are in."""

    target_system: int
    target_component: int
    config: LogConfig = DEFAULT_LOG_CONFIG
    attempts: int = 0
    next_deadline: float | None = None
    entries: dict[int, LogEntry] = field(default_factory=dict)
    expected: int | None = None
    error: LogError | None = None
    finished: bool = False

    @property
    def done(self) -> bool:
        return self.finished or self.error is not None

    @property
    def result(self) -> list[LogEntry]:
        return [self.entries[k] for k in sorted(self.entries)]

    def _send(self, now: float) -> list[MavMessage]:
        self.attempts += 1
        self.next_deadline = now + self.config.silence_s
        return [mavlink2.MAVLink_log_request_list_message(self.target_system, self.target_component, 0, 0xFFFF)]

    def start(self, now: float) -> list[MavMessage]:
        return self._send(now)

    def on_message(self, msg: MavMessage, now: float) -> list[MavMessage]:
        if self.done or msg.get_type() != "LOG_ENTRY" or msg.get_srcSystem() != self.target_system:
            return []
        entry = entry_of(msg)
        self.expected = entry.num_logs
        # num_logs 0: ArduPilot's "no logs" (its one LOG_ENTRY has id 0). ArduPilot numbers logs from 1, PX4
        # from 0 (mavlink_log_handler.cpp: the list file's line number), so id 0 is a log whenever there are logs.
        if entry.num_logs > 0:
            self.entries[entry.log_id] = entry
        self.next_deadline = now + self.config.silence_s
        if len(self.entries) >= entry.num_logs:
            self.finished, self.next_deadline = True, None
        return []

    def on_tick(self, now: float) -> list[MavMessage]:
        if self.done or self.next_deadline is None or now < self.next_deadline:
            return []
        if self.attempts >= self.config.max_attempts:
            self.error, self.next_deadline = LogTimeout(0, self.attempts), None
            return []
        return self._send(now)


def _merge(spans: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    """Add [lo, hi) to sorted, disjoint half-open spans."""
    out: list[tuple[int, int]] = []
    for a, b in spans:
        if b < lo or a > hi:
            out.append((a, b))
        else:
            lo, hi = min(lo, a), max(hi, b)
    out.append((lo, hi))
    return sorted(out)


@dataclass(slots=True, kw_only=True)
class LogWindow:
    """Bytes [offset, offset + count) of log `log_id`, with gap detection and re-requests.

    Holes are found when the burst reaches the window's end (a later frame
    arrived, an earlier one did not) or goes silent, and each missing range
    is requested again. `attempts` counts requests
    in a row that brought no new byte; it resets whenever bytes arrive.
    """

    log_id: int
    offset: int
    count: int
    target_system: int
    target_component: int
    config: LogConfig = DEFAULT_LOG_CONFIG
    attempts: int = 0
    requests: int = 0
    rerequested_bytes: int = 0
    next_deadline: float | None = None
    eof_offset: int | None = None  # the log's end, once a short or empty LOG_DATA said so
    error: LogError | None = None
    _buf: bytearray = field(default_factory=bytearray)
    _have: list[tuple[int, int]] = field(default_factory=list)  # received spans, absolute offsets
    _progress: bool = False
    _req_end: int = 0  # end of the range last asked for

    def __post_init__(self) -> None:
        self._buf = bytearray(self.count)

    @property
    def end(self) -> int:
        end = self.offset + self.count
        return end if self.eof_offset is None else min(end, self.eof_offset)

    @property
    def done(self) -> bool:
        return self.error is not None or not self.missing()

    def missing(self) -> list[tuple[int, int]]:
        """Byte ranges [lo, hi) of the window not received yet."""
        out, at = [], self.offset
        for a, b in self._have:
            if a > at:
                out.append((at, min(a, self.end)))
            at = max(at, b)
        if at < self.end:
            out.append((at, self.end))
        return [(a, b) for a, b in out if a < b]

    def contiguous(self) -> bytes:
        """The bytes from `offset` up to the first hole."""
        first = self._have[0] if self._have else None
        if first is None or first[0] > self.offset:
            return b""
        return bytes(self._buf[: min(first[1], self.end) - self.offset])

    def _request(self, lo: int, hi: int) -> MavMessage:
        self.requests += 1
        self._req_end = hi
        return mavlink2.MAVLink_log_request_data_message(
            self.target_system, self.target_component, self.log_id, lo, hi - lo)

    def start(self, now: float) -> list[MavMessage]:
        self.attempts = 1
        self.next_deadline = now + self.config.silence_s
        return [self._request(self.offset, self.offset + self.count)]

    def on_message(self, msg: MavMessage, now: float) -> list[MavMessage]:
        if (self.done or msg.get_type() != "LOG_DATA" or msg.get_srcSystem() != self.target_system
                or int(msg.id) != self.log_id):
            return []
        ofs, n = int(msg.ofs), int(msg.count)
        if n == 0 or (n < LOG_DATA_BYTES and ofs + n != self._req_end):
            # An empty frame says `ofs` is past the end; a short one that does not end the range
            # asked for is the file's last (a short one that does is only the request's last).
            self.eof_offset = ofs + n if self.eof_offset is None else min(self.eof_offset, ofs + n)
        lo, hi = max(ofs, self.offset), min(ofs + n, self.offset + self.count)
        if lo < hi:
            data = bytes(msg.data[:n])
            self._buf[lo - self.offset : hi - self.offset] = data[lo - ofs : hi - ofs]
            self._have = _merge(self._have, lo, hi)
            self._progress = True
        self.next_deadline = now + self.config.silence_s
        holes = self.missing()
        if holes and ofs + n >= min(self._req_end, self.end):
            # The burst answering the last request is complete and left holes: ask for them now, not after a silence.
            return self._rerequest(holes, now)
        return []

    def _rerequest(self, holes: list[tuple[int, int]], now: float) -> list[MavMessage]:
        if self._progress:
            self.attempts, self._progress = 0, False
        self.attempts += 1
        if self.attempts > self.config.max_attempts:
            self.error = LogTimeout(self.log_id, self.attempts - 1, self.offset + len(self.contiguous()))
            self.next_deadline = None
            return []
        self.next_deadline = now + self.config.silence_s
        # ArduPilot serves one request at a time (a new one replaces the running one), so
        # the holes are asked for as one span: from the first hole to the end of the last.
        lo, hi = holes[0][0], holes[-1][1]
        self.rerequested_bytes += hi - lo
        return [self._request(lo, hi)]

    def on_tick(self, now: float) -> list[MavMessage]:
        if self.done or self.next_deadline is None or now < self.next_deadline:
            return []
        return self._rerequest(self.missing(), now)


class LogSink(Protocol):
    """Where a download's bytes go, in order: `data` starts at `offset_bytes`. It may wait (a paused download)."""

    async def __call__(self, offset_bytes: int, data: bytes) -> None: ...
