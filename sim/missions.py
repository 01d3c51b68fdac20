"""The vehicle side of the MAVLink mission protocol, sans-IO, like ArduPilot.

Upload: MISSION_COUNT → the vehicle asks for each item with
MISSION_REQUEST(seq) (ArduPilot: the legacy request, seen on a real ArduCopter
although the items came as MISSION_ITEM_INT; PX4: MISSION_REQUEST_INT) → MISSION_ITEM_INT (or legacy MISSION_ITEM) → ... →
MISSION_ACK. A lost item is asked for again after `retry_s` of silence
(ArduPilot: 1 s); after `timeout_s` without progress the upload is cancelled
with MISSION_ACK(OPERATION_CANCELLED) and the stored list is left as it was
(items are staged and committed only when complete).
Download: MISSION_REQUEST_LIST → MISSION_COUNT; MISSION_REQUEST_INT(seq) →
MISSION_ITEM_INT; the ground station's MISSION_ACK ends it (nothing to track).
MISSION_CLEAR_ALL empties a list. Mission types MISSION (0), FENCE (1) and
RALLY (2) are kept separately.

ArduPilot's home convention: seq 0 of the MISSION list is the home position;
downloads always report the live home there, whatever was uploaded. PX4 has
none (`home_at_seq0` False): it stores item `seq` at index `seq` and flies
from index 0 (`mavlink_mission.cpp`), so its list is returned as stored.

ArduPilot stores items in its own form (`ardupilot_form`, written from
ArduPilot's AP_Mission and checked against a real ArduCopter): a download
returns that form, not what was sent. It refuses an item it cannot store with
a MISSION_ACK error (e.g. INVALID_PARAM7 for a location without an altitude)
and, like ArduPilot, does not roll back: the list is cut to the new count and
keeps the old items beyond the refused one. The simulator deliberately
re-implements this rather than importing the gateway's table: it is the test
peer, and must not agree with the gateway by construction.

Methods take the incoming message and sim time and return the messages to
send; `poll(now)` drives re-requests and the timeout.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, replace
from typing import Any, Final

from pymavlink.dialects.v20 import ardupilotmega as mavlink2

from mavjet.sim import missionitem
from mavjet.sim.missionitem import SimMissionItem
from mavjet.sim.px4form import px4_form, px4_refusal

MISSION: Final = missionitem.MISSION
FENCE: Final = 1
RALLY: Final = 2
TYPES: Final = (MISSION, FENCE, RALLY)
MAX_ITEMS: Final = 700  # ArduPilot SITL's storage holds ~700 waypoints

NAV_WAYPOINT: Final = 16


def _f32(v: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", v))[0]) if math.isfinite(v) else v


def _uint(v: float, bits: int) -> float:
    return 0.0 if not math.isfinite(v) else float(int(_f32(v)) & ((1 << bits) - 1))


def _sign(v: float) -> float:
    return -1.0 if v < 0 else 1.0


def _flag(v: float) -> float:
    return 1.0 if v > 0 else 0.0


def _zero(v: float) -> float:
    return 0.0


def _keep(v: float) -> float:
    return 0.0 if math.isnan(v) else _f32(v)


M = mavlink2
# command -> (param1..param4 storage, has a location); ArduCopter's AP_Mission for the commands the sim flies.
_STORE: Final[dict[int, tuple[tuple[Any, Any, Any, Any], bool]]] = {
    M.MAV_CMD_NAV_WAYPOINT: ((lambda v: _uint(v, 16), _zero, _zero, _zero), True),
    M.MAV_CMD_NAV_LOITER_UNLIM: ((_zero, _zero, _keep, _zero), True),
    M.MAV_CMD_NAV_LOITER_TIME: ((lambda v: _uint(v, 16), _zero, _sign, _flag), True),
    M.MAV_CMD_NAV_RETURN_TO_LAUNCH: ((_zero, _zero, _zero, _zero), False),
    M.MAV_CMD_NAV_LAND: ((lambda v: _uint(v, 16), _zero, _zero, _sign), True),
    M.MAV_CMD_NAV_TAKEOFF: ((lambda v: _uint(v, 16), _zero, _zero, _zero), True),
    M.MAV_CMD_NAV_SPLINE_WAYPOINT: ((lambda v: _uint(v, 16), _zero, _zero, _zero), True),
    M.MAV_CMD_NAV_DELAY: ((_keep, _keep, _keep, _keep), False),
    M.MAV_CMD_CONDITION_DELAY: ((_keep, _zero, _zero, _zero), False),
    M.MAV_CMD_DO_JUMP: ((lambda v: _uint(v, 16), _keep, _zero, _zero), False),
    M.MAV_CMD_DO_CHANGE_SPEED: ((lambda v: _uint(v, 8), _keep, _keep, _zero), False),
    M.MAV_CMD_DO_SET_ROI: ((lambda v: _uint(v, 16), _zero, _zero, _zero), True),
    M.MAV_CMD_DO_SET_SERVO: ((lambda v: _uint(v, 8), lambda v: _uint(v, 16), _zero, _zero), False),
}
_LOCATION_FRAME: Final = {0: 0, 5: 0, 2: 0, 3: 3, 6: 3, 10: 10, 11: 10}
_NAN_P4_OK: Final = frozenset({M.MAV_CMD_NAV_WAYPOINT, M.MAV_CMD_NAV_LAND, M.MAV_CMD_NAV_TAKEOFF})
TERRAIN_FRAMES: Final = frozenset({M.MAV_FRAME_GLOBAL_TERRAIN_ALT, M.MAV_FRAME_GLOBAL_TERRAIN_ALT_INT})


def ardupilot_refusal(item: SimMissionItem) -> int | None:
    """The MISSION_ACK error ArduPilot answers for `item`, or None when it stores it."""
    if item.mission_type == RALLY:
        if item.frame not in (3, 6):
            return int(M.MAV_MISSION_UNSUPPORTED_FRAME)
        return None if math.isfinite(item.z) and -32768 <= item.z <= 32767 else int(M.MAV_MISSION_INVALID_PARAM7)
    if item.mission_type != MISSION:
        return None
    for k, v in enumerate((item.param1, item.param2, item.param3, item.param4)):
        if math.isinf(v) or (math.isnan(v) and not (k == 3 and item.command in _NAN_P4_OK)):
            return int(M.MAV_MISSION_INVALID_PARAM1) + k
    rule = _STORE.get(item.command)
    if rule is not None and rule[1]:
        if math.isnan(item.z) or abs(item.z) >= 83000:
            return int(M.MAV_MISSION_INVALID_PARAM7)
        if item.frame not in _LOCATION_FRAME:
            return int(M.MAV_MISSION_UNSUPPORTED_FRAME)
    return None


def ardupilot_form(item: SimMissionItem) -> SimMissionItem:
    """What ArduPilot stores of `item`, i.e. what a download returns."""
    if item.mission_type == FENCE:
        p1 = _uint(item.param1, 8) if item.command in (5001, 5002) else _keep(item.param1)
        return replace(item, current=0, autocontinue=0, param1=p1, param2=0.0, param3=0.0, param4=0.0, z=0.0)
    if item.mission_type == RALLY:
        return replace(item, current=0, autocontinue=0, frame=3, param1=0.0, param2=0.0, param3=0.0, param4=0.0,
                       z=float(int(item.z)))  # fmt: skip
    rule = _STORE.get(item.command)
    if rule is None:
        return replace(item, current=0, autocontinue=1)
    store, located = rule
    p = [f(v) for f, v in zip(store, (item.param1, item.param2, item.param3, item.param4), strict=True)]
    if located:
        z = _f32(int(_f32(_f32(item.z) * 100.0)) / 100.0)  # whole centimetres
        return replace(item, current=0, autocontinue=1, frame=_LOCATION_FRAME.get(item.frame, item.frame),
                       param1=p[0], param2=p[1], param3=p[2], param4=p[3], z=z)  # fmt: skip
    return replace(item, current=0, autocontinue=1, frame=0, param1=p[0], param2=p[1], param3=p[2], param4=p[3],
                   x=0, y=0, z=0.0)  # fmt: skip


@dataclass(slots=True, kw_only=True)
class _Upload:
    mission_type: int
    count: int
    partner: tuple[int, int]
    items: list[SimMissionItem]
    last_progress: float
    last_request: float


def _ack(partner: tuple[int, int], result: int, mission_type: int) -> Any:
    return mavlink2.MAVLink_mission_ack_message(partner[0], partner[1], result, mission_type)


class MissionServer:
    """Stored lists per mission type plus at most one upload in flight."""

    def __init__(self, *, retry_s: float = 1.0, timeout_s: float = 8.0, ardupilot: bool = True) -> None:
        self.ardupilot = ardupilot  # store items in ArduPilot's form and refuse what it refuses
        self.home_at_seq0 = ardupilot  # MISSION seq 0 is the live home (ArduPilot), else the first item (PX4)
        self.retry_s = retry_s
        self.timeout_s = timeout_s
        self.lists: dict[int, list[SimMissionItem]] = {t: [] for t in TYPES}
        self.upload: _Upload | None = None
        self.home_item: SimMissionItem | None = None  # reported as MISSION seq 0
        self.uploads_completed = 0
        self.rerequests = 0
        self.changed: set[int] = set()  # mission types committed since the owner last looked

    # --- what the vehicle reports -------------------------------------------------
    def items(self, mission_type: int) -> list[SimMissionItem]:
        """The list as a download would return it (MISSION seq 0 = live home)."""
        stored = self.lists.get(mission_type, [])
        if mission_type != MISSION or not self.home_at_seq0:
            return list(stored)
        home = self.home_item or SimMissionItem(seq=0, frame=mavlink2.MAV_FRAME_GLOBAL, command=NAV_WAYPOINT)
        return [replace(home, seq=0), *stored[1:]]

    def count(self, mission_type: int) -> int:
        n = len(self.lists.get(mission_type, []))
        return max(n, 1) if mission_type == MISSION and self.home_at_seq0 else n

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
        item = SimMissionItem.from_msg(msg)
        if item.frame not in _FRAMES:
            self.upload = None
            return [_ack(partner, mavlink2.MAV_MISSION_UNSUPPORTED_FRAME, mtype)]
        if self.ardupilot:
            refusal = ardupilot_refusal(item)
            if refusal is not None:
                # ArduPilot has already cut its list to the new count and keeps what it stored: no rollback.
                old = self.lists[mtype]
                self.upload = None
                self._commit(mtype, [*up.items, *old[len(up.items) : up.count]])
                return [_ack(partner, refusal, mtype)]
            item = ardupilot_form(item)
        else:
            refusal = px4_refusal(item)
            if refusal is not None:  # PX4 cancels the whole transfer and keeps its old list
                self.upload = None
                return [_ack(partner, refusal, mtype)]
            item = px4_form(item)
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
        # ArduPilot asks with MISSION_REQUEST (id 40) for every item, whatever the ground station sends;
        # PX4 with MISSION_REQUEST_INT. Either way MISSION_ITEM_INT and legacy MISSION_ITEM are accepted.
        if self.ardupilot:
            return mavlink2.MAVLink_mission_request_message(up.partner[0], up.partner[1], len(up.items), up.mission_type)
        return mavlink2.MAVLink_mission_request_int_message(up.partner[0], up.partner[1], len(up.items), up.mission_type)

    def _commit(self, mission_type: int, items: list[SimMissionItem]) -> None:
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
