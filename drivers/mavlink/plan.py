"""QGroundControl `.plan` files ⇄ MAVLink mission items, and a mission digest.

Operators author missions in QGroundControl; the gateway stores the `.plan`
JSON in TWIN_BLOBS and uploads it with the mission protocol. This module is
the pure conversion (no I/O beyond `json.loads` of text handed in):

- `mission.items` of type SimpleItem → MISSION_ITEM_INT fields. Seq 0 is the
  planned home position (ArduPilot convention), plan items follow from seq 1.
  Params 5/6/7 are lat/lon/alt; in global frames lat/lon become degrees*1e7.
  A DO_JUMP's param1 names its target's `doJumpId`; it becomes that item's
  seq, as QGroundControl does on load.
- `geoFence` polygons and circles → FENCE items (MAV_CMD_NAV_FENCE_*);
  `rallyPoints` → RALLY items.
- `digest(items)`: sha256 over the items' read-back normal form
  (`normalise.digest_form`: what an autopilot keeps of each item, float32
  values), so a plan and the vehicle's read-back of it have the same digest.
  ArduPilot overwrites seq 0 with the live home position, so the mission
  digest skips seq 0 by default; compare an upload with its download by digest.
- Validation: an item a vehicle would refuse is refused here, named by its
  index in the plan (`mission.items[5]: NAV_WAYPOINT in a global frame needs
  an altitude (param7 is null)`). Terrain-relative frames (10, 11) pass
  here: only the vehicle can say whether it holds terrain data for them, so
  the gateway asks it before each upload (mavjet.drivers.mavlink.terrain) and
  refuses the plan there, naming the item.

Errors are `PlanError` with `path` naming the offending field
(`mission.items[3].params`), so an operator can fix the file.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from mavjet.contract.errors import MavjetError
from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.drivers.mavlink.mission import FENCE, GLOBAL_FRAMES, MISSION, RALLY, MissionItem
from mavjet.drivers.mavlink.normalise import command_name, digest_form, is_positional
from mavjet.drivers.mavlink.terrain import TERRAIN_FRAMES

MAV_CMD_NAV_WAYPOINT = mavlink2.MAV_CMD_NAV_WAYPOINT
MAV_CMD_DO_JUMP = mavlink2.MAV_CMD_DO_JUMP
FENCE_POLY_INCLUSION = mavlink2.MAV_CMD_NAV_FENCE_POLYGON_VERTEX_INCLUSION
FENCE_POLY_EXCLUSION = mavlink2.MAV_CMD_NAV_FENCE_POLYGON_VERTEX_EXCLUSION
FENCE_CIRCLE_INCLUSION = mavlink2.MAV_CMD_NAV_FENCE_CIRCLE_INCLUSION
FENCE_CIRCLE_EXCLUSION = mavlink2.MAV_CMD_NAV_FENCE_CIRCLE_EXCLUSION
RALLY_POINT = mavlink2.MAV_CMD_NAV_RALLY_POINT

KNOWN_FRAMES = frozenset(range(0, 22))  # MAV_FRAME values defined by MAVLink
MAX_PLAN_BYTES = 4 * 1024 * 1024


class PlanError(MavjetError):
    """A `.plan` document is not usable; `path` is the field at fault."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"plan {path}: {reason}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """A parsed plan: items per mission type, ready to upload."""

    mission: tuple[MissionItem, ...]
    fence: tuple[MissionItem, ...]
    rally: tuple[MissionItem, ...]
    home: tuple[float, float, float] | None  # lat_deg, lon_deg, alt_m (AMSL)
    vehicle_type: int | None = None  # mission.vehicleType (MAV_TYPE), when the file says

    @property
    def mission_digest(self) -> str:
        return digest(self.mission)

    @property
    def terrain_items(self) -> int:
        """Mission items in a terrain-relative frame: the vehicle decides whether it can fly them."""
        return sum(1 for it in self.mission if it.frame in TERRAIN_FRAMES)

    def items_for(self, mission_type: int) -> tuple[MissionItem, ...]:
        return {MISSION: self.mission, FENCE: self.fence, RALLY: self.rally}[mission_type]


# ---------------------------------------------------------------------------
# validation helpers


def _number(value: Any, path: str, *, allow_null: bool = False) -> float:
    if value is None and allow_null:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PlanError(path, f"expected a number, got {type(value).__name__}")
    out = float(value)
    if math.isinf(out) or math.isnan(out):
        raise PlanError(path, "must be finite")
    return out


def _int(value: Any, path: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not float(value).is_integer():
        raise PlanError(path, f"expected an integer, got {value!r}")
    out = int(value)
    if not (lo <= out <= hi):
        raise PlanError(path, f"{out} outside [{lo}, {hi}]")
    return out


def _lat_lon(lat: float, lon: float, path: str) -> tuple[int, int]:
    if math.isnan(lat) or not (-90.0 <= lat <= 90.0):
        raise PlanError(path, f"latitude {lat} outside [-90, 90]")
    if math.isnan(lon) or not (-180.0 <= lon <= 180.0):
        raise PlanError(path, f"longitude {lon} outside [-180, 180]")
    return round(lat * 1e7), round(lon * 1e7)


def _mapping(value: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise PlanError(path, f"expected an object, got {type(value).__name__}")
    return value


def _list(value: Any, path: str) -> Sequence[Any]:
    if not isinstance(value, list):
        raise PlanError(path, f"expected a list, got {type(value).__name__}")
    return value


def _require(obj: Mapping[str, Any], key: str, path: str) -> Any:
    if key not in obj:
        raise PlanError(f"{path}.{key}" if path else key, "missing")
    return obj[key]


def _point(value: Any, path: str, n: int) -> list[float]:
    pts = _list(value, path)
    if len(pts) < n:
        raise PlanError(path, f"expected [lat, lon{', alt' if n == 3 else ''}], got {len(pts)} values")
    return [_number(v, f"{path}[{i}]") for i, v in enumerate(pts[:n])]


# ---------------------------------------------------------------------------
# parse


def parse_plan(text: str | bytes) -> Plan:
    """Parse `.plan` JSON text; raises PlanError with the path of the first problem."""
    if len(text) > MAX_PLAN_BYTES:
        raise PlanError("$", f"larger than {MAX_PLAN_BYTES} bytes")
    try:
        doc = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PlanError("$", f"not JSON: {exc}") from None
    return plan_from_dict(doc)


def plan_from_dict(doc: Any) -> Plan:
    root = _mapping(doc, "$")
    if root.get("fileType") != "Plan":
        raise PlanError("fileType", f"expected 'Plan', got {root.get('fileType')!r}")
    mission = _mapping(_require(root, "mission", ""), "mission")
    version = mission.get("version", 2)
    if version != 2:
        raise PlanError("mission.version", f"only version 2 is supported, got {version!r}")
    home: tuple[float, float, float] | None = None
    if mission.get("plannedHomePosition") is not None:
        lat, lon, alt = _point(mission["plannedHomePosition"], "mission.plannedHomePosition", 3)
        _lat_lon(lat, lon, "mission.plannedHomePosition")
        home = (lat, lon, alt)
    raw_items = _list(_require(mission, "items", "mission"), "mission.items")
    mission_items = _mission_items(raw_items, home)
    fence_items: tuple[MissionItem, ...] = ()
    if root.get("geoFence") is not None:
        fence_items = _fence_items(_mapping(root["geoFence"], "geoFence"))
    rally_items: tuple[MissionItem, ...] = ()
    if root.get("rallyPoints") is not None:
        rally_items = _rally_items(_mapping(root["rallyPoints"], "rallyPoints"))
    vtype = mission.get("vehicleType")
    vehicle_type = vtype if isinstance(vtype, int) and not isinstance(vtype, bool) else None
    return Plan(mission=mission_items, fence=fence_items, rally=rally_items, home=home, vehicle_type=vehicle_type)


def _home_item(home: tuple[float, float, float] | None) -> MissionItem:
    if home is None:
        return MissionItem(seq=0, frame=mavlink2.MAV_FRAME_GLOBAL, command=MAV_CMD_NAV_WAYPOINT)
    x, y = _lat_lon(home[0], home[1], "mission.plannedHomePosition")
    return MissionItem(seq=0, frame=mavlink2.MAV_FRAME_GLOBAL, command=MAV_CMD_NAV_WAYPOINT, x=x, y=y, z=home[2])


def _mission_items(raw_items: Sequence[Any], home: tuple[float, float, float] | None) -> tuple[MissionItem, ...]:
    items: list[MissionItem] = [_home_item(home)]
    jump_ids: dict[int, int] = {}  # doJumpId -> seq
    for i, raw in enumerate(raw_items):
        path = f"mission.items[{i}]"
        obj = _mapping(raw, path)
        kind = obj.get("type", "SimpleItem")
        if kind != "SimpleItem":
            raise PlanError(f"{path}.type", f"{kind!r} items (surveys, structure scans) are not supported; export as SimpleItems")
        seq = len(items)
        command = _int(_require(obj, "command", path), f"{path}.command", 0, 65535)
        frame = _int(_require(obj, "frame", path), f"{path}.frame", 0, 255)
        if frame not in KNOWN_FRAMES:
            raise PlanError(f"{path}.frame", f"unknown MAV_FRAME {frame}")
        params_raw = list(_list(_require(obj, "params", path), f"{path}.params"))
        if "coordinate" in obj and len(params_raw) == 4:
            # QGroundControl's older item form: params 1-4, then "coordinate": [lat, lon, alt] as params 5-7
            params_raw += _point(obj["coordinate"], f"{path}.coordinate", 3)
        if len(params_raw) != 7:
            raise PlanError(f"{path}.params", f"expected 7 params, got {len(params_raw)}")
        p = [_number(v, f"{path}.params[{k}]", allow_null=True) for k, v in enumerate(params_raw)]
        auto = obj.get("autoContinue", True)
        if not isinstance(auto, bool):
            raise PlanError(f"{path}.autoContinue", f"expected true/false, got {auto!r}")
        _check_item(path, command, frame, p)
        if frame in GLOBAL_FRAMES and not (math.isnan(p[4]) and math.isnan(p[5])):
            x, y = _lat_lon(p[4], p[5], f"{path}.params")
        elif frame in GLOBAL_FRAMES:
            x, y = 0, 0  # a positional command with no position: "here"
        else:
            x = 0 if math.isnan(p[4]) else round(p[4])
            y = 0 if math.isnan(p[5]) else round(p[5])
        if "doJumpId" in obj and obj["doJumpId"] is not None:
            jid = _int(obj["doJumpId"], f"{path}.doJumpId", 0, 2**31 - 1)
            if jid in jump_ids:
                raise PlanError(f"{path}.doJumpId", f"duplicate doJumpId {jid}")
            jump_ids[jid] = seq
        items.append(
            MissionItem(
                seq=seq, frame=frame, command=command, current=0, autocontinue=1 if auto else 0,
                param1=p[0], param2=p[1], param3=p[2], param4=p[3], x=x, y=y, z=p[6], mission_type=MISSION,
            )
        )
    # DO_JUMP param1: doJumpId of the target → its seq.
    for n, item in enumerate(items):
        if item.command == MAV_CMD_DO_JUMP:
            target = item.param1
            if math.isnan(target) or int(target) not in jump_ids:
                raise PlanError(f"mission.items[{n - 1}].params[0]", f"DO_JUMP to unknown doJumpId {target}")
            items[n] = replace(item, param1=float(jump_ids[int(target)]))
    return tuple(items)


def _check_item(path: str, command: int, frame: int, p: Sequence[float]) -> None:
    """Refuse what a vehicle would refuse or could not fly, naming the item and the field."""
    name = command_name(command)
    if frame in GLOBAL_FRAMES and is_positional(command) and math.isnan(p[6]):
        raise PlanError(path, f"{name} in a global frame needs an altitude (param7 is null)")


def _fence_items(fence: Mapping[str, Any]) -> tuple[MissionItem, ...]:
    items: list[MissionItem] = []
    for i, raw in enumerate(_list(fence.get("polygons", []), "geoFence.polygons")):
        path = f"geoFence.polygons[{i}]"
        obj = _mapping(raw, path)
        inclusion = obj.get("inclusion", True)
        if not isinstance(inclusion, bool):
            raise PlanError(f"{path}.inclusion", "expected true/false")
        vertices = _list(_require(obj, "polygon", path), f"{path}.polygon")
        if len(vertices) < 3:
            raise PlanError(f"{path}.polygon", f"a polygon needs at least 3 vertices, got {len(vertices)}")
        command = FENCE_POLY_INCLUSION if inclusion else FENCE_POLY_EXCLUSION
        for k, v in enumerate(vertices):
            lat, lon = _point(v, f"{path}.polygon[{k}]", 2)
            x, y = _lat_lon(lat, lon, f"{path}.polygon[{k}]")
            items.append(
                MissionItem(
                    seq=len(items), frame=mavlink2.MAV_FRAME_GLOBAL, command=command,
                    param1=float(len(vertices)), x=x, y=y, mission_type=FENCE,
                )
            )
    for i, raw in enumerate(_list(fence.get("circles", []), "geoFence.circles")):
        path = f"geoFence.circles[{i}]"
        obj = _mapping(raw, path)
        inclusion = obj.get("inclusion", True)
        if not isinstance(inclusion, bool):
            raise PlanError(f"{path}.inclusion", "expected true/false")
        circle = _mapping(_require(obj, "circle", path), f"{path}.circle")
        lat, lon = _point(_require(circle, "center", f"{path}.circle"), f"{path}.circle.center", 2)
        radius_m = _number(_require(circle, "radius", f"{path}.circle"), f"{path}.circle.radius")
        if radius_m <= 0:
            raise PlanError(f"{path}.circle.radius", f"must be positive, got {radius_m}")
        x, y = _lat_lon(lat, lon, f"{path}.circle.center")
        items.append(
            MissionItem(
                seq=len(items), frame=mavlink2.MAV_FRAME_GLOBAL,
                command=FENCE_CIRCLE_INCLUSION if inclusion else FENCE_CIRCLE_EXCLUSION,
                param1=radius_m, x=x, y=y, mission_type=FENCE,
            )
        )
    return tuple(items)


def _rally_items(rally: Mapping[str, Any]) -> tuple[MissionItem, ...]:
    items: list[MissionItem] = []
    for i, raw in enumerate(_list(rally.get("points", []), "rallyPoints.points")):
        lat, lon, alt = _point(raw, f"rallyPoints.points[{i}]", 3)
        x, y = _lat_lon(lat, lon, f"rallyPoints.points[{i}]")
        items.append(
            MissionItem(
                seq=i, frame=mavlink2.MAV_FRAME_GLOBAL_RELATIVE_ALT, command=RALLY_POINT,
                x=x, y=y, z=alt, mission_type=RALLY,
            )
        )
    return tuple(items)


# ---------------------------------------------------------------------------
# back to a plan


def _param(v: float) -> float | None:
    return None if math.isnan(v) else v


def plan_to_dict(
    mission: Sequence[MissionItem],
    fence: Sequence[MissionItem] = (),
    rally: Sequence[MissionItem] = (),
) -> dict[str, Any]:
    """A `.plan` document from items (seq 0 of `mission` is the home position)."""
    home: list[float] = [0.0, 0.0, 0.0]
    body = list(mission)
    if body and body[0].seq == 0:
        h = body.pop(0)
        home = [h.x / 1e7, h.y / 1e7, h.z]
    out_items: list[dict[str, Any]] = []
    for it in body:
        if it.frame in GLOBAL_FRAMES:
            p5: float | None = it.x / 1e7
            p6: float | None = it.y / 1e7
        else:
            p5, p6 = float(it.x), float(it.y)
        out_items.append(
            {
                "type": "SimpleItem",
                "command": it.command,
                "frame": it.frame,
                "autoContinue": bool(it.autocontinue),
                "doJumpId": it.seq,
                "params": [_param(it.param1), _param(it.param2), _param(it.param3), _param(it.param4), p5, p6, _param(it.z)],
            }
        )
    polygons: list[dict[str, Any]] = []
    circles: list[dict[str, Any]] = []
    k = 0
    fence_list = list(fence)
    while k < len(fence_list):
        it = fence_list[k]
        if it.command in (FENCE_POLY_INCLUSION, FENCE_POLY_EXCLUSION):
            n = max(1, int(it.param1))
            verts = fence_list[k : k + n]
            polygons.append(
                {
                    "inclusion": it.command == FENCE_POLY_INCLUSION,
                    "polygon": [[v.x / 1e7, v.y / 1e7] for v in verts],
                    "version": 1,
                }
            )
            k += n
        elif it.command in (FENCE_CIRCLE_INCLUSION, FENCE_CIRCLE_EXCLUSION):
            circles.append(
                {
                    "inclusion": it.command == FENCE_CIRCLE_INCLUSION,
                    "circle": {"center": [it.x / 1e7, it.y / 1e7], "radius": it.param1},
                    "version": 1,
                }
            )
            k += 1
        else:
            k += 1  # return point or unknown fence item: not representable in a .plan
    return {
        "fileType": "Plan",
        "groundStation": "mavjet",
        "version": 1,
        "mission": {"version": 2, "firmwareType": 3, "vehicleType": 2, "plannedHomePosition": home, "items": out_items},
        "geoFence": {"version": 2, "polygons": polygons, "circles": circles},
        "rallyPoints": {"version": 2, "points": [[r.x / 1e7, r.y / 1e7, r.z] for r in rally]},
    }


# ---------------------------------------------------------------------------
# digest


def digest(items: Iterable[MissionItem], *, include_home: bool = False) -> str:
    """sha256 (hex) of the canonical items; seq 0 of a MISSION is skipped unless `include_home`.

    Two missions with the same digest fly the same way: items are hashed in
    the form an autopilot reads them back (`normalise.digest_form`: unused
    params 0, frames of non-positional commands 0, float32 values, fence and
    rally autocontinue 0), `current` is ignored, and the home position (which
    ArduPilot replaces with the live home) is left out.
    """
    h = hashlib.sha256()
    for item in items:
        if item.mission_type == MISSION and item.seq == 0 and not include_home:
            continue
        h.update(repr(digest_form(item).canonical()).encode())
        h.update(b"\n")
    return h.hexdigest()
