"""The vehicle side of the MAVLink mission protocol, sans-IO, like ArduPilot.

Upload: MISSION_COUNT → the vehicle asks for each item with
MISSION_REQUEST_INT(seq) → MISSION_ITEM_INT (or legacy MISSION_ITEM) → ... →
MISSION_ACK. A lost item is asked for again after `retry_s` of silence
(ArduPilot: 1 s); after `timeout_s` without progress the upload is cancelled
with MISSION_ACK(OPERATION_CANCELLED) and the stored list is left as it was
(items are staged and committed only when complete).
Download: MISSION_REQUEST_LIST → MISSION_COUNT; MISSION_REQUEST_INT(seq) →
MISSION_ITEM_INT; the ground station's MISSION_ACK ends it (nothing to track).
MISSION_CLEAR_ALL empties a list. Mission types MISSION (0), FENCE (1) and
RALLY (2) are kept separately.

ArduPilot's home convention: seq 0 of the MISSION list is the home position;
downloads always report the live home there, whatever was uploaded.

Methods take the incoming message and sim time and return the messages to
send; `poll(now)` drives re-requests and the timeout.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Final

from pymavlink.dialects.v20 import ardupilotmega as mavlink2

MISSION: Final = 0
FENCE: Final = 1
RALLY: Final = 2
TYPES: Final = (MISSION, FENCE, RALLY)
MAX_ITEMS: Final = 700  # ArduPilot SITL's storage holds ~700 waypoints

NAV_WAYPOINT: Final = 16


@dataclass(frozen=True, slots=True, kw_only=True)
class MissionItem:
    """One stored item, as MISSION_ITEM_INT carries it (x/y are degE7 for global frames)."""

    seq: int
    frame: int
    command: int
    current: int = 0
    autocontinue: int = 1
    param1: float = 0.0
    param2: float = 0.0
    param3: float = 0.0
    param4: float = 0.0
    x: int = 0
    y: int = 0
    z: float = 0.0
    mission_type: int = MISSION

    @property
    def lat_deg(self) -> float:
        return self.x / 1e7

    @property
    def lon_deg(self) -> float:
        return self.y / 1e7

    @classmethod
    def from_msg(cls, msg: Any) -> MissionItem:
        is_int = msg.get_type() == "MISSION_ITEM_INT"
        x = int(msg.x) if is_int else round(msg.x * 1e7)
        y = int(msg.y) if is_int else round(msg.y * 1e7)
        return cls(
            seq=int(msg.seq),
            frame=int(msg.frame),
            command=int(msg.command),
            current=int(msg.current),
            autocontinue=int(msg.autocontinue),
            param1=float(msg.param1),
            param2=float(msg.param2),
            param3=float(msg.param3),
            param4=float(msg.param4),
            x=x,
            y=y,
            z=float(msg.z),
            mission_type=int(getattr(msg, "mission_type", 0)),
        )

    def to_msg(self, target_system: int, target_component: int, *, as_int: bool = True) -> Any:
        if as_int:
            return mavlink2.MAVLink_mission_item_int_message(
                target_system, target_component, self.seq, self.frame, self.command, self.current,
                self.autocontinue, self.param1, self.param2, self.param3, self.param4, self.x, self.y,
                self.z, self.mission_type,
            )  # fmt: skip
        return mavlink2.MAVLink_mission_item_message(
            target_system, target_component, self.seq, self.frame, self.command, self.current,
            self.autocontinue, self.param1, self.param2, self.param3, self.param4, self.x / 1e7,
            self.y / 1e7, self.z, self.mission_type,
        )  # fmt: skip


@dataclass(slots=True, kw_only=True)
class _Upload:
    mission_type: int
    count: int
    partner: tuple[int, int]
    items: list[MissionItem]
    last_progress: float
    last_request: float


def _ack(partner: tuple[int, int], result: int, mission_type: int) -> Any:
    return mavlink2.MAVLink_mission_ack_message(partner[0], partner[1], result, mission_type)


class MissionServer:
    """Stored lists per mission type plus at most one upload in flight."""

    def __init__(self, *, retry_s: float = 1.0, timeout_s: float = 8.0) -> None:
        self.retry_s = retry_s
        self.timeout_s = timeout_s
        self.lists: dict[int, list[MissionItem]] = {t: [] for t in TYPES}
        self.upload: _Upload | None = None
        self.home_item: MissionItem | None = None  # reported as MISSION seq 0
        self.uploads_completed = 0
        self.rerequests = 0
        self.changed: set[int] = set()  # mission types committed since the owner last looked

    # --- what the vehicle reports -------------------------------------------------
    def items(self, mission_type: int) -> list[MissionItem]:
        """The list as a download would return it (MISSION seq 0 = live home)."""
        stored = self.lists.get(mission_type, [])
        if mission_type != MISSION:
            return list(stored)
        home = self.home_item or MissionItem(seq=0, frame=mavlink2.MAV_FRAME_GLOBAL, command=NAV_WAYPOINT)
        return [replace(home, seq=0), *stored[1:]]

    def count(self, mission_type: int) -> int:
        n = len(self.lists.get(mission_type, []))
        return max(n, 1) if mission_type == MISSION else n

    # --- protocol -----------------------------------------------------------------
    def on_count(self, msg: Any, partner: tuple[int, int], now: float) -> list[Any]:
        mtype = int(getattr(msg, "mission_type", 0))
        if mtype not in TYPES:
            return [_ack(partner, mavlink2.MAV_MISSION_UNSUPPORTED, mtype)]
        count = int(msg.count)
        if count > MAX_ITEMS:
            return [_ack(partner, mavlink2.MAV_MISSION_NO_SPACE, mtype)]
        if self.upload is not None and self.upload.partner != partner:
            return [_ack(partner, mavlink2.MAV_MISSION_DENIED, mtype)]
        if count == 0:
            self.upload = None
            self._commit(mtype, [])
            return [_ack(partner, mavlink2.MAV_MISSION_ACCEPTED, mtype)]
        self.upload = _Upload(mission_type=mtype, count=count, partner=partner, items=[], last_progress=now, last_request=now)
        return [self._request(self.upload)]

    def on_item(self, msg: Any, partner: tuple[int, int], now: float) -> list[Any]:
        up = self.upload
        mtype = int(getattr(msg, "mission_type", 0))
        if up is None or up.mission_type != mtype or up.partner != partner:
            # ArduPilot answers stray items with an error ack
            return [_ack(partner, mavlink2.MAV_MISSION_ERROR, mtype)] if up is None else []
        seq = int(msg.seq)
        if seq != len(up.items):
            return []  # duplicate or out of order: the re-request timer asks again
        item = MissionItem.from_msg(msg)
        if item.frame not in _FRAMES:
            self.upload = None
            return [_ack(partner, mavlink2.MAV_MISSION_UNSUPPORTED_FRAME, mtype)]
        up.items.append(item)
        up.last_progress = now
        if len(up.items) < up.count:
            return [self._request(up, now)]
        self.upload = None
        self._commit(mtype, up.items)
        self.uploads_completed += 1
        return [_ack(partner, mavlink2.MAV_MISSION_ACCEPTED, mtype)]

    def on_request_list(self, msg: Any, partner: tuple[int, int]) -> list[Any]:
        mtype = int(getattr(msg, "mission_type", 0))
        if mtype not in TYPES:
            return [_ack(partner, mavlink2.MAV_MISSION_UNSUPPORTED, mtype)]
        return [mavlink2.MAVLink_mission_count_message(partner[0], partner[1], self.count(mtype), mtype)]

    def on_request(self, msg: Any, partner: tuple[int, int]) -> list[Any]:
        mtype = int(getattr(msg, "mission_type", 0))
        items = self.items(mtype) if mtype in TYPES else []
        seq = int(msg.seq)
        if not 0 <= seq < len(items):
            return [_ack(partner, mavlink2.MAV_MISSION_INVALID_SEQUENCE, mtype)]
        return [items[seq].to_msg(partner[0], partner[1], as_int=msg.get_type() == "MISSION_REQUEST_INT")]

    def on_clear(self, msg: Any, partner: tuple[int, int]) -> list[Any]:
        mtype = int(getattr(msg, "mission_type", 0))
        if mtype == mavlink2.MAV_MISSION_TYPE_ALL:
            for t in TYPES:
                self._commit(t, [])
        elif mtype in TYPES:
            self._commit(mtype, [])
        else:
            return [_ack(partner, mavlink2.MAV_MISSION_UNSUPPORTED, mtype)]
        if self.upload is not None and mtype in (self.upload.mission_type, mavlink2.MAV_MISSION_TYPE_ALL):
            self.upload = None
        return [_ack(partner, mavlink2.MAV_MISSION_ACCEPTED, mtype)]

    def poll(self, now: float) -> list[Any]:
        up = self.upload
        if up is None:
            return []
        if now - up.last_progress > self.timeout_s:
            self.upload = None
            return [_ack(up.partner, mavlink2.MAV_MISSION_OPERATION_CANCELLED, up.mission_type)]
        if now - up.last_request > self.retry_s:
            self.rerequests += 1
            return [self._request(up, now)]
        return []

    def reset_transfers(self) -> None:
        self.upload = None

    # --- internals ----------------------------------------------------------------
    def _request(self, up: _Upload, now: float | None = None) -> Any:
        if now is not None:
            up.last_request = now
        # always the _INT request, as ArduPilot does; legacy MISSION_ITEM answers are accepted too
        return mavlink2.MAVLink_mission_request_int_message(up.partner[0], up.partner[1], len(up.items), up.mission_type)

    def _commit(self, mission_type: int, items: list[MissionItem]) -> None:
        self.lists[mission_type] = list(items)
        self.changed.add(mission_type)


_FRAMES: Final = frozenset(
    {
        mavlink2.MAV_FRAME_GLOBAL,
        mavlink2.MAV_FRAME_MISSION,
        mavlink2.MAV_FRAME_GLOBAL_RELATIVE_ALT,
        mavlink2.MAV_FRAME_GLOBAL_INT,
        mavlink2.MAV_FRAME_GLOBAL_RELATIVE_ALT_INT,
        mavlink2.MAV_FRAME_GLOBAL_TERRAIN_ALT,
        mavlink2.MAV_FRAME_GLOBAL_TERRAIN_ALT_INT,
    }
)
