"""Who serves a vehicle, as `mavjet twin` and `mavjet fleet` show it: the owner, live standbys, gone ones marked."""

from __future__ import annotations

import datetime as dt

from mavjet.gateway.ownership.presence import PresenceValue, decode_presence, encode_presence
from mavjet.ops.fleet import FleetView
from mavjet.ops.read import GATEWAY_MISSED_PERIODS, GatewaySeen, Record
from mavjet.ops.twin import gateway_lines

NOW = dt.datetime(2026, 12, 5, 10, 0, 0, tzinfo=dt.UTC)


def standby(vid: str, holder: str, age_s: float, period_s: float = 5.0) -> GatewaySeen:
    return GatewaySeen(vid=vid, role="standby", holder=holder, instance=holder.partition("@")[0], host="h", pid=1,
                       since="2026-12-05T09:00:00.000+00:00", stored=NOW - dt.timedelta(seconds=age_s),
                       gone_after_s=GATEWAY_MISSED_PERIODS * period_s, link="up", owner="gw-a@h:1:aa")


def test_a_record_is_gone_after_three_periods() -> None:
    assert not standby("VID-001", "gw-b@h:2:bb", 14.9).gone(NOW)
    assert standby("VID-001", "gw-b@h:2:bb", 15.1).gone(NOW)
    assert standby("VID-001", "gw-b@h:2:bb", 3.5, period_s=1.0).gone(NOW)


def test_the_record_round_trips_and_garbage_is_nothing() -> None:
    v = PresenceValue(holder="gw-b@h:2:bb", instance="gw-b", host="h", pid=2, role="standby", owner=None,
                      link="down", active_link="backup", since="s", updated_at="u", period_s=5.0)
    assert decode_presence(encode_presence(v)) == v
    assert decode_presence(b"not json") is None and decode_presence(b"{}") is None


def test_fleet_counts_live_standbys_and_shows_the_owner() -> None:
    view = FleetView()
    link = {"state": "up", "period_s": 1.0, "gateway": "gw-a", "owner": "gw-a@h:1:aa"}
    view.on_state(Record("fleet.t.veh.VID-001.state.link", "VID-001", "link", 1, NOW, link))
    view.on_state(Record("fleet.t.veh.VID-001.state.status", "VID-001", "status", 1, NOW, {"mode": "GUIDED"}))
    view.on_presence("VID-001", "gw-b-bb", standby("VID-001", "gw-b@h:2:bb", 1.0))
    view.on_presence("VID-001", "gw-c-cc", standby("VID-001", "gw-c@h:3:cc", 60.0))  # crashed: gone
    view.on_presence("VID-001", "gw-d-dd", standby("VID-001", "gw-d@h:4:dd", 1.0))
    view.on_presence("VID-001", "gw-d-dd", None)  # stopped cleanly: its record deleted
    assert view.standbys("VID-001", NOW) == 1
    [row] = view.to_json(NOW)["vehicles"]  # type: ignore[misc]
    assert (row["owner"], row["standbys"]) == ("gw-a@h:1:aa", 1)
    assert view.rows(NOW)[0][10] == "1" and "STBY" in view.render(NOW)
    assert "STBY" not in view.render(NOW, width=60).splitlines()[0]  # who serves goes first on a narrow screen
    view.presence = None  # TWIN_LEASES not readable
    assert view.rows(NOW)[0][10] == "-" and view.to_json(NOW)["vehicles"][0]["standbys"] is None  # type: ignore[index]


def test_twin_lists_the_owner_then_standbys_marking_gone_ones() -> None:
    owner = GatewaySeen(vid="VID-001", role="owner", holder="gw-a@h:1:aa", instance="gw-a", host="h", pid=1,
                        since="2026-12-05T09:00:00.000+00:00", stored=NOW - dt.timedelta(seconds=0.4), gone_after_s=5.0)
    lines = gateway_lines(owner, [standby("VID-001", "gw-b@h:2:bb", 2.0), standby("VID-001", "gw-c@h:3:cc", 40.0)], NOW)
    assert [role for role, _ in lines] == ["owner", "standby", "standby"]
    assert "renewed 0.4s ago" in lines[0][1] and "GONE" not in lines[1][1] and "GONE (seen 40.0s ago)" in lines[2][1]
    assert gateway_lines(None, None, NOW)[0][0] == "standbys"  # not readable: said, not hidden
    assert standby("VID-001", "gw-c@h:3:cc", 40.0).to_json(NOW)["gone"] is True
