"""Mission Planner `.waypoints` files (QGC WPL 110) → the `.plan` document mavjet stores. Pure.

The format (Mission Planner, MAVProxy `wp save`, QGroundControl's old export):

    QGC WPL 110
    0	1	0	16	0	0	0	0	-35.363261	149.165230	584.090000	1
    1	0	3	22	0	0	0	0	-35.361354	149.165218	20.000000	1

one item a line, tab-separated (spaces are accepted too): INDEX CURRENT FRAME
COMMAND PARAM1..PARAM4 LAT LON ALT AUTOCONTINUE. Item 0 is the home (AMSL);
the mission follows from index 1, numbered consecutively. A DO_JUMP's param1
is its target's index. The file holds no geofence or rally points (Mission
Planner saves those in files of their own).

`waypoints_to_plan_dict` turns it into a QGroundControl `.plan` document
(`doJumpId` = index, so DO_JUMP targets stay put), which `plan.plan_from_dict`
then validates like any `.plan`; errors name the file's line
(`line 4 (index 2)`), not the `.plan` field they became.
"""

from __future__ import annotations

import math
import re
from typing import Any

from mavjet.drivers.mavlink.plan import MAX_PLAN_BYTES, Plan, PlanError, plan_from_dict

HEADER = "QGC WPL 110"
COLUMNS = 12
_ITEM_PATH = re.compile(r"^mission\.items\[(\d+)\]")


def is_waypoints(data: str | bytes) -> bool:
    """Whether the text is a QGC WPL file (by its first line)."""
    head = data[:32].decode("utf-8", "replace") if isinstance(data, bytes) else data[:32]
    return head.lstrip("\ufeff").lstrip().startswith("QGC WPL")


def waypoints_label(seq: int) -> str:
    """Where item `seq` is in a `.waypoints` file: line seq + 2 (line 1 is the header, line 2 the home)."""
    return f"line {seq + 2} (index {seq})"


def _float(text: str, where: str, column: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        raise PlanError(where, f"{column}: expected a number, got {text!r}") from None
    if math.isnan(value):
        return None
    if math.isinf(value):
        raise PlanError(where, f"{column}: must be finite")
    return value


def _int(text: str, where: str, column: str) -> int:
    value = _float(text, where, column)
    if value is None or not value.is_integer():
        raise PlanError(where, f"{column}: expected an integer, got {text!r}")
    return int(value)


def waypoints_to_plan_dict(data: str | bytes) -> dict[str, Any]:
    """The `.plan` document of a QGC WPL 110 file; raises PlanError naming the line."""
    if len(data) > MAX_PLAN_BYTES:
        raise PlanError("$", f"larger than {MAX_PLAN_BYTES} bytes")
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise PlanError("$", f"not UTF-8 text: {exc.reason}") from None
    lines = text.lstrip("\ufeff").splitlines()
    if not lines or lines[0].split() != HEADER.split():
        first = lines[0].strip()[:40] if lines else ""
        raise PlanError("line 1", f"expected {HEADER!r}, got {first!r}")
    home: list[float] | None = None
    items: list[dict[str, Any]] = []
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        where = f"line {n}"
        cols = line.split()
        if len(cols) != COLUMNS:
            raise PlanError(where, f"expected {COLUMNS} columns (INDEX CURRENT FRAME COMMAND P1..P4 LAT LON ALT "
                                   f"AUTOCONTINUE), got {len(cols)}")
        index = _int(cols[0], where, "INDEX")
        expected = 0 if home is None else len(items) + 1
        if index != expected:
            raise PlanError(where, f"INDEX {index}: expected {expected} (items are numbered from 0, the home)")
        frame = _int(cols[2], where, "FRAME")
        command = _int(cols[3], where, "COMMAND")
        params = [_float(c, where, f"PARAM{k + 1}") for k, c in enumerate(cols[4:11])]
        auto = _int(cols[11], where, "AUTOCONTINUE")
        if auto not in (0, 1):
            raise PlanError(where, f"AUTOCONTINUE: expected 0 or 1, got {auto}")
        if home is None:
            lat, lon, alt = params[4], params[5], params[6]
            home = [lat or 0.0, lon or 0.0, alt or 0.0]
            continue
        items.append({"type": "SimpleItem", "command": command, "frame": frame, "autoContinue": auto == 1,
                      "doJumpId": index, "params": params})
    if home is None:
        raise PlanError("line 2", "no items: a .waypoints file starts with the home (index 0)")
    return {
        "fileType": "Plan", "groundStation": "mavjet (from QGC WPL 110)", "version": 1,
        "mission": {"version": 2, "plannedHomePosition": home, "items": items},
        "geoFence": {"version": 2, "polygons": [], "circles": []},
        "rallyPoints": {"version": 2, "points": []},
    }  # fmt: skip


def _relabel(exc: PlanError) -> PlanError:
    """A `.plan` path (`mission.items[2].params`) as the `.waypoints` line it came from."""
    m = _ITEM_PATH.match(exc.path)
    if m is None:
        return exc
    return PlanError(waypoints_label(int(m.group(1)) + 1), exc.reason)


def parse_waypoints(data: str | bytes) -> tuple[dict[str, Any], Plan]:
    """The `.plan` document and the parsed plan of a `.waypoints` file; PlanError names the line."""
    doc = waypoints_to_plan_dict(data)
    try:
        return doc, plan_from_dict(doc)
    except PlanError as exc:
        raise _relabel(exc) from None
