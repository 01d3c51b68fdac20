"""desired.geofence documents → FENCE items and ArduPilot fence parameters."""

from __future__ import annotations

from typing import Any

import pytest

from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.drivers.mavlink.fence import GeofenceError, geofence_from_dict
from mavjet.drivers.mavlink.mission import FENCE

DOC: dict[str, Any] = {
    "polygons": [{"inclusion": True, "points": [[-35.36, 149.16], [-35.36, 149.17], [-35.37, 149.17], [-35.37, 149.16]]}],
    "circles": [{"inclusion": False, "center": [-35.365, 149.165], "radius_m": 40}],
    "max_alt_m": 120,
    "action": "land",
}


def test_items_and_params() -> None:
    fence = geofence_from_dict(DOC)
    items = fence.items()
    assert [i.seq for i in items] == list(range(5))
    assert all(i.mission_type == FENCE for i in items)
    assert [i.command for i in items[:4]] == [mavlink2.MAV_CMD_NAV_FENCE_POLYGON_VERTEX_INCLUSION] * 4
    assert all(i.param1 == 4.0 for i in items[:4])
    assert items[0].x == -353600000 and items[1].y == 1491700000
    assert items[4].command == mavlink2.MAV_CMD_NAV_FENCE_CIRCLE_EXCLUSION and items[4].param1 == 40.0
    assert fence.params() == {"FENCE_ENABLE": 1.0, "FENCE_TYPE": 5.0, "FENCE_ACTION": 2.0, "FENCE_ALT_MAX": 120.0}
    assert len(fence.digest) == 64


def test_altitude_only_fence_has_no_zones() -> None:
    fence = geofence_from_dict({"max_alt_m": 60})
    assert fence.items() == ()
    assert fence.params()["FENCE_TYPE"] == 1.0 and fence.params()["FENCE_ACTION"] == 1.0


def test_digest_changes_with_zones() -> None:
    other = {**DOC, "circles": [{"inclusion": False, "center": [-35.365, 149.165], "radius_m": 41}]}
    assert geofence_from_dict(DOC).digest != geofence_from_dict(other).digest
    assert geofence_from_dict(DOC).digest == geofence_from_dict(dict(DOC)).digest


@pytest.mark.parametrize(
    ("doc", "path"),
    [
        ([], "geofence"),
        ({}, "geofence"),
        ({"max_alt_m": 50, "colour": "red"}, "geofence"),
        ({"max_alt_m": -1}, "geofence.max_alt_m"),
        ({"max_alt_m": 50, "action": "explode"}, "geofence.action"),
        ({"polygons": [{"points": [[0, 0], [0, 1]]}]}, "geofence.polygons[0].points"),
        ({"polygons": [{"points": [[0, 0], [0, 1], [95, 1]]}]}, "geofence.polygons[0].points[2]"),
        ({"circles": [{"center": [0, 0], "radius_m": 0}]}, "geofence.circles[0].radius_m"),
        ({"circles": [{"center": [0, 190], "radius_m": 5}]}, "geofence.circles[0].center"),
        ({"circles": [{"center": [0, 0], "radius_m": 5, "inclusion": "no"}]}, "geofence.circles[0].inclusion"),
    ],
)
def test_bad_documents(doc: Any, path: str) -> None:
    with pytest.raises(GeofenceError) as err:
        geofence_from_dict(doc)
    assert err.value.path == path
