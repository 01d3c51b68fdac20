"""Which telemetry a vehicle sends, and when: ArduPilot's stream rules.

ArduPilot sends nothing but HEARTBEAT until a ground station asks. Two ways
to ask, both honoured here:

- REQUEST_DATA_STREAM (legacy): a stream id selects a *group* of messages
  at one rate in Hz (ArduCopter's groupings below; rate 0 or start_stop 0
  stops the group).
- MAV_CMD_SET_MESSAGE_INTERVAL: one message id, interval in microseconds;
  -1 disables the message, 0 returns it to its group rate. An explicit
  interval wins over the group rate.

`Schedule` is sans-IO: `due(now)` returns the message ids to send at sim
time `now`, keeping each stream on a fixed cadence (next = previous +
interval, so a coarse tick does not erode the rate) and catching up at most
a few missed slots after a stall instead of bursting.

ArduPilot sends streamed messages from "buckets", one per interval
(GCS_Common.cpp, `set_ap_message_interval`): a message asked for at an
interval some bucket already has joins that bucket and its phase, and a
bucket sends all its messages together when it is due. So ATTITUDE and
GLOBAL_POSITION_INT, both at 10 Hz, leave in one write however far apart
they were requested. The heartbeat keeps its own cadence (a "deferred
message" there). PX4 times each stream on its own (MavlinkStream::update),
which `bucketed=False` keeps.
"""

from __future__ import annotations

import heapq
from typing import Final

HEARTBEAT: Final = 0
SYS_STATUS: Final = 1
SYSTEM_TIME: Final = 2
GPS_RAW_INT: Final = 24
ATTITUDE: Final = 30
GLOBAL_POSITION_INT: Final = 33
MISSION_CURRENT: Final = 42
VFR_HUD: Final = 74
TERRAIN_REQUEST: Final = 133  # ArduPilot's MSG_TERRAIN_REQUEST (sim/terrain.py)
TERRAIN_REPORT: Final = 136
BATTERY_STATUS: Final = 147
FENCE_STATUS: Final = 162
HOME_POSITION: Final = 242
EXTENDED_SYS_STATE: Final = 245

STREAMABLE: Final = frozenset(
    {
        HEARTBEAT,
        SYS_STATUS,
        SYSTEM_TIME,
        GPS_RAW_INT,
        ATTITUDE,
        GLOBAL_POSITION_INT,
        MISSION_CURRENT,
        VFR_HUD,
        TERRAIN_REQUEST,
        TERRAIN_REPORT,
        BATTERY_STATUS,
        FENCE_STATUS,
        HOME_POSITION,
        EXTENDED_SYS_STATE,
    }
)

# MAV_DATA_STREAM_* → messages, as ArduCopter's GCS_Mavlink.cpp groups them
# (restricted to the messages the simulator models).
GROUPS: Final[dict[int, tuple[int, ...]]] = {
    2: (SYS_STATUS, MISSION_CURRENT, GPS_RAW_INT, FENCE_STATUS, EXTENDED_SYS_STATE),  # EXTENDED_STATUS
    6: (GLOBAL_POSITION_INT,),  # POSITION
    10: (ATTITUDE,),  # EXTRA1
    11: (VFR_HUD,),  # EXTRA2
    12: (SYSTEM_TIME, BATTERY_STATUS, TERRAIN_REQUEST, TERRAIN_REPORT),  # EXTRA3
}
ALL_STREAMS: Final = 0  # MAV_DATA_STREAM_ALL
MAX_CATCH_UP: Final = 3  # slots sent at once after a stall, at most


class Schedule:
    """Per-vehicle message intervals and due times (sim seconds)."""

    __slots__ = ("_bucketed", "_entries", "_group_hz", "_overrides", "next_due")

    def __init__(self, *, bucketed: bool = True) -> None:
        self._bucketed = bucketed
        self._group_hz: dict[int, float] = {}
        self._overrides: dict[int, float | None] = {HEARTBEAT: 1.0}  # None: disabled
        # A heap of (next due, key, interval, msg ids): one entry per bucket (ArduPilot) or per
        # message (PX4; the heartbeat on both). `due` touches only the entries due, not all a
        # dozen streams, on every call (a large fleet calls it 20k times a second).
        self._entries: list[tuple[float, float, float, tuple[int, ...]]] = []
        self.next_due = float("inf")
        self._rebuild(0.0)

    def reset(self, now: float) -> None:
        """After a reboot: heartbeat only."""
        self._group_hz.clear()
        self._overrides = {HEARTBEAT: 1.0}
        self._entries = []
        self._rebuild(now)

    def interval(self, msg_id: int) -> float | None:
        """Current interval in seconds, or None when the message is not being sent."""
        if msg_id in self._overrides:
            return self._overrides[msg_id]
        rates = [hz for sid, hz in self._group_hz.items() if msg_id in GROUPS.get(sid, ())]
        best = max(rates, default=0.0)
        return 1.0 / best if best > 0 else None

    def set_interval(self, msg_id: int, interval_us: float, now: float) -> bool:
        """SET_MESSAGE_INTERVAL; False when the message is not one the vehicle can stream."""
        if msg_id not in STREAMABLE:
            return False
        if interval_us < 0:
            self._overrides[msg_id] = None
        elif interval_us == 0:
            if msg_id == HEARTBEAT:
                self._overrides[HEARTBEAT] = 1.0
            else:
                self._overrides.pop(msg_id, None)
        else:
            self._overrides[msg_id] = max(interval_us / 1e6, 0.001)
        self._rebuild(now)
        return True

    def request_stream(self, stream_id: int, rate_hz: float, start: bool, now: float) -> None:
        """REQUEST_DATA_STREAM."""
        ids = list(GROUPS) if stream_id == ALL_STREAMS else [stream_id]
        for sid in ids:
            if sid not in GROUPS:
                continue
            if start and rate_hz > 0:
                self._group_hz[sid] = float(rate_hz)
            else:
                self._group_hz.pop(sid, None)
        self._rebuild(now)

    def _rebuild(self, now: float) -> None:
        # key: the interval for a bucket, -1 - msg id for a message timed on its own.
        phase = {(e[1], e[2]): e[0] for e in self._entries}
        members: dict[float, tuple[float, list[int]]] = {}
        for msg_id in sorted(STREAMABLE):
            iv = self.interval(msg_id)
            if iv is None:
                continue
            key = iv if self._bucketed and msg_id != HEARTBEAT else float(-1 - msg_id)
            members.setdefault(key, (iv, []))[1].append(msg_id)
        # A bucket, or a message at an unchanged interval, keeps its phase. ArduPilot's new bucket
        # first sends one interval after it is made (its last_sent_ms starts at now); the heartbeat
        # and PX4's streams, each timed on its own, start at once.
        entries = [
            (phase.get((key, iv), now + iv if key >= 0 else now), key, iv, tuple(ids))
            for key, (iv, ids) in members.items()
        ]
        heapq.heapify(entries)
        self._entries = entries
        self.next_due = entries[0][0] if entries else float("inf")

    def due(self, now: float) -> list[int]:
        """Message ids to send at `now` (a message may appear more than once after a stall).

        Slot by slot; messages due in the same slot come in message-id order."""
        if now < self.next_due:
            return []
        slots: list[tuple[float, tuple[int, ...]]] = []
        heap = self._entries
        while heap[0][0] <= now:
            t, key, iv, ids = heap[0]
            n = 0
            while t <= now and n < MAX_CATCH_UP:
                slots.append((t, ids))
                t += iv
                n += 1
            if t <= now:  # fell far behind: resynchronise rather than burst
                t = now + iv
            heapq.heapreplace(heap, (t, key, iv, ids))
        self.next_due = heap[0][0]
        if len(slots) == 1:  # nearly always: one bucket, its ids already in order
            return list(slots[0][1])
        return [msg_id for _, msg_id in sorted((t, msg_id) for t, ids in slots for msg_id in ids)]

    def active(self) -> dict[int, float]:
        """msg id → interval (s) for every message being sent."""
        return {msg_id: e[2] for e in self._entries for msg_id in e[3]}
