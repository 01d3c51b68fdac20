"""The central cluster's files and the pieces the topology adds, checked without servers.

tests/deploy/test_central_hubs.py runs the whole topology (two minutes of a
cut uplink); this checks, quickly, what it relies on: every hub is named in
every centre stream's sources, the digest's transform lands on the state
subjects `mavjet fleet` reads, the hub's leaf remote keeps stored subjects
off the uplink, the `[digest]` table, and `mavjet fleet`'s HUB column.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

import pytest

from mavjet.contract.errors import ConfigError
from mavjet.gateway.publish.digest import DigestConfig, digest_subject
from mavjet.gateway.resolve import build_config, load_toml
from mavjet.ops.fleet import FleetView
from mavjet.ops.provision import load_definitions
from mavjet.ops.read import Record

ROOT = Path(__file__).resolve().parents[2]
CENTRAL = ROOT / "deploy/central"
HUBS = ("hub-a", "hub-b")
NOW = dt.datetime(2026, 12, 5, 10, 0, 0, tzinfo=dt.UTC)


def test_every_centre_stream_sources_every_hub_through_its_domain() -> None:
    wanted = {"TWIN_EVENTS": "TWIN_EVENTS", "TWIN_TRACKS": "TWIN_TRACKS", "TWIN_STATE": "TWIN_DIGEST"}
    for path in sorted((CENTRAL / "centre").glob("*.json")):
        config = json.loads(path.read_text())
        assert config["num_replicas"] == 3, path.name
        sources = config["sources"]
        assert [s["external"]["api"] for s in sources] == [f"$JS.{h}.API" for h in HUBS], path.name
        assert {s["name"] for s in sources} == {wanted.pop(config["name"])}, path.name
    assert not wanted  # each of the three is there


def test_the_digest_lands_on_the_state_subjects_newest_only() -> None:
    config = json.loads((CENTRAL / "centre/twin_state.json").read_text())
    assert config["max_msgs_per_subject"] == 1
    for s in config["sources"]:
        [tf] = s["subject_transforms"]
        assert tf == {"src": digest_subject("prod", "*", "*"),
                      "dest": "fleet.prod.veh.{{wildcard(1)}}.state.{{wildcard(2)}}"}
    [hub] = load_definitions(CENTRAL / "hub/jetstream", env="prod", replicas=1)
    assert hub.name == "TWIN_DIGEST" and hub.config.max_msgs_per_subject == 1
    assert hub.config.subjects == [digest_subject("prod", "*", ">")]


@pytest.mark.parametrize("hub", HUBS)
def test_a_hub_is_its_own_domain_and_keeps_stored_subjects_off_the_uplink(hub: str) -> None:
    text = (CENTRAL / f"{hub}.conf").read_text()
    assert re.search(rf"^\s*domain: {hub}$", text, re.M) and f"server_name: {hub}" in text
    assert re.search(r'credentials: "/etc/mavjet/[\w.-]+\.creds"', text)
    denied = re.search(r"deny_imports: \[([^\]]*)\]", text)
    assert denied is not None
    for subject in ("fleet.*.veh.*.evt.>", "fleet.*.veh.*.state.>", "fleet.*.veh.*.track",
                    "fleet.*.veh.*.digest.>", "$KV.>"):
        assert f'"{subject}"' in denied.group(1), subject
    assert 'deny_exports: ["fleet.*.veh.*.cmd.>"]' in text
    assert "fleet.*.veh.*.cmd" not in denied.group(1)  # commands from the centre must come in


def test_the_centre_nodes_share_routes_and_listen_for_leaves() -> None:
    common = (CENTRAL / "centre-common.conf").read_text()
    assert re.findall(r'"nats://([\w-]+):6222"', common) == [f"centre-{n}" for n in (1, 2, 3)]
    assert re.search(r"leafnodes \{\s*listen: 0\.0\.0\.0:7422", common) and "domain: centre" in common
    for n in (1, 2, 3):
        text = (CENTRAL / f"centre-{n}.conf").read_text()
        assert f"server_name: centre-{n}" in text and "include ./centre-common.conf" in text


def test_the_digest_table() -> None:
    raw = {"vehicles": [{"vid": "VID-001", "endpoint": "tcp:h:1"}],
           "digest": {"hz": 0.2, "channels": ["status", "position", "battery"], "hub": "hub-a"}}
    cfg = build_config(raw)
    assert cfg.digest == DigestConfig(hz=0.2, channels=("status", "position", "battery"), hub="hub-a")
    assert build_config({"vehicles": raw["vehicles"]}).digest.hz == 0  # off by default
    for bad, key in (({"hz": 5}, "digest.hz"), ({"channels": ["link"]}, "digest.channels"),
                     ({"channels": ["nope"]}, "digest.channels"), ({"hub": "a.b"}, "digest.hub"),
                     ({"rate": 1}, "digest.rate"), ({"hz": True}, "digest.hz")):
        with pytest.raises(ConfigError, match=re.escape(key)):
            build_config({**raw, "digest": bad})


def test_the_hub_gateway_config_loads_with_its_digest() -> None:
    cfg = build_config(load_toml(CENTRAL / "gateway.toml"))
    assert cfg.digest == DigestConfig(hz=0.2, channels=("status", "position"))
    assert cfg.nats.servers == ("nats://hub-a.example.net:4222",)


def _view(link: dict[str, object]) -> FleetView:
    view = FleetView(stale_after_s=15.0)
    view.on_state(Record("fleet.t.veh.VID-001.state.link", "VID-001", "link", 1, NOW,
                         {"state": "up", "period_s": 5.0, "gateway": "gw-a", **link}))
    view.on_state(Record("fleet.t.veh.VID-001.state.status", "VID-001", "status", 1, NOW, {"mode": "GUIDED"}))
    return view


def test_fleet_shows_each_vehicles_hub_only_where_there_are_hubs() -> None:
    central = _view({"hub": "hub-a"})
    assert central.render(NOW).splitlines()[0].split()[-1] == "HUB"
    assert central.rows(NOW)[0][-1] == "hub-a"
    rows: Any = central.to_json(NOW)["vehicles"]
    assert [(r["hub"], r["stale"]) for r in rows] == [("hub-a", False)]
    plain = _view({})
    assert "HUB" not in plain.render(NOW) and len(plain.rows(NOW)[0]) == 11
    rows = plain.to_json(NOW)["vehicles"]
    assert [r["hub"] for r in rows] == [None]
