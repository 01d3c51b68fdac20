"""Fast tests of the pure parts: decoding, options, partition planning, audit generation, report."""

from __future__ import annotations

import json
from typing import Any
from xml.etree import ElementTree

import msgpack
import pytest

from mavjet.analytics.columns import COLUMN_NAMES, SCHEMA_DDL, Columns, event_type
from mavjet.analytics.options import SourceOptions, format_time_us, parse_time_us, plan_ranges
from mavjet.analytics.report import ReportData, bar_chart, grouped_log_bars, render, stacked_columns
from mavjet.analytics.synth import AuditConfig, Truth, generate
from mavjet.contract.envelope import pack
from mavjet.contract.errors import ConfigError
from mavjet.contract.units import haversine_m

T0_NS = 1_749_945_600 * 10**9


def _row(cols: Columns, i: int = 0) -> dict[str, object]:
    return {name: cols.cols[k][i] for k, name in enumerate(COLUMN_NAMES)}


def test_decode_event_into_typed_columns() -> None:
    c = Columns()
    data = {"mode": "RTL", "armed": True, "alt_m": 42, "battery_pct": 55.5, "name": "arm", "result": "accepted",
            "latency_ms": 12.5, "cmd_id": "c1", "mav_result": 0, "seq": 3}
    t_us = c.add("TWIN_EVENTS", 7, "fleet.test.veh.VID-1.evt.cmd_result", pack("VID-1", T0_NS + 1500, data))
    assert t_us == T0_NS // 1000 + 1
    r = _row(c)
    assert r["seq"] == 7 and r["vid"] == "VID-1" and r["type"] == "cmd_result" and r["error"] is None
    assert r["alt_m"] == 42.0 and isinstance(r["alt_m"], float)
    assert r["armed"] is True and r["mode"] == "RTL" and r["cmd_name"] == "arm" and r["mission_seq"] == 3
    assert json.loads(str(r["data"])) == data
    assert r["lat_deg"] is None


def test_wrong_types_become_null_not_errors() -> None:
    c = Columns()
    c.add("S", 1, "fleet.t.veh.V.evt.armed", pack("V", T0_NS, {"alt_m": "high", "armed": 1, "severity": True}))
    r = _row(c)
    assert r["error"] is None and r["alt_m"] is None and r["armed"] is None and r["severity"] is None


@pytest.mark.parametrize(
    "payload",
    [b"\xc1", msgpack.packb([1, 2]), msgpack.packb({"vid": "V", "data": {}}), b""],
)
def test_undecodable_payload_is_a_row_with_error(payload: bytes) -> None:
    c = Columns()
    assert c.add("S", 9, "fleet.t.veh.VID-9.evt.armed", payload) is None
    r = _row(c)
    assert r["error"] and "bad envelope" in str(r["error"])
    assert r["vid"] == "VID-9" and r["type"] == "armed" and r["time"] is None and r["seq"] == 9


def test_schema_matches_columns() -> None:
    assert [part.split()[0] for part in SCHEMA_DDL.split(", ")] == list(COLUMN_NAMES)
    assert event_type("fleet.p.veh.V.evt.link_lost") == "link_lost"
    assert event_type("fleet.p.veh.V.state.position") is None


def test_plan_ranges_cover_exactly() -> None:
    for first, last, n in [(1, 10, 3), (5, 5, 4), (1, 1_000_000, None), (100, 2_099, None), (1, 10, 1)]:
        ranges = plan_ranges(first, last, n)
        assert ranges[0][0] == first and ranges[-1][1] == last
        assert all(b >= a for a, b in ranges)
        assert all(ranges[i][1] + 1 == ranges[i + 1][0] for i in range(len(ranges) - 1))
    assert len(plan_ranges(1, 1_000_000, None)) == 4
    assert len(plan_ranges(1, 5_000, None)) == 2
    assert len(plan_ranges(1, 10, None)) == 1
    assert plan_ranges(10, 9, 3) == []


def test_source_options_parse_and_validate() -> None:
    o = SourceOptions.from_options(
        {"URL": "nats://127.0.0.1:1", "subjects": "a.>, b.>", "start_time": "2025-06-15T00:00:00Z",
         "end_seq": "99", "partitions": "3", "lateness": "1h"}
    )
    assert o.subjects == ("a.>", "b.>") and o.end_seq == 99 and o.partitions == 3
    assert o.start_time_us == 1_749_945_600 * 10**6 and o.lateness_s == 3600
    assert format_time_us(o.start_time_us).startswith("2025-06-15T00:00:00")
    assert parse_time_us("1749945600.5", key="t") == 1_749_945_600_500_000
    assert SourceOptions.from_options({"url": "localhost:4222"}).servers == ["nats://localhost:4222"]  # as the nats CLI
    with pytest.raises(ConfigError):
        SourceOptions.from_options({"url": "http://localhost:4222"})
    with pytest.raises(ConfigError):
        SourceOptions.from_options({"url": "localhost:port"})
    with pytest.raises(ConfigError):
        SourceOptions.from_options({"start_seq": "10", "end_seq": "5"})
    with pytest.raises(ConfigError):
        SourceOptions.from_options({"start_time": "yesterday"})
    with pytest.raises(ConfigError):
        SourceOptions.from_options({"partitions": "0"})


def test_audit_is_deterministic_and_truth_matches_events() -> None:
    cfg = AuditConfig(vehicles=5, days=3, seed=3, env="t", end_ns=T0_NS)
    t1, t2 = Truth(), Truth()
    a = [e for day in generate(cfg, t1) for e in day]
    b = [e for day in generate(cfg, t2) for e in day]
    assert a == b and t1.summary() == t2.summary()
    other = [e for day in generate(AuditConfig(vehicles=5, days=3, seed=4, env="t", end_ns=T0_NS), Truth()) for e in day]
    assert other != a
    assert len(a) == t1.events
    assert len({e.msg_id for e in a}) == len(a)
    assert all(cfg.start_ns <= e.time_ns < cfg.end_ns + 86_400 * 10**9 for e in a)
    assert [e.time_ns for e in a] == sorted(e.time_ns for e in a)
    armed = sum(1 for e in a if e.type == "armed")
    assert armed == len(t1.flights) == sum(t1.flights_by_vid.values())
    assert sum(1 for e in a if e.type == "failsafe") == len(t1.failsafes)
    assert sum(1 for e in a if e.type == "cmd_result") == len(t1.commands)
    # a vehicle's history does not depend on how many vehicles are generated
    small = [e for day in generate(AuditConfig(vehicles=2, days=3, seed=3, env="t", end_ns=T0_NS), Truth()) for e in day]
    assert [e for e in a if e.vid in ("VID-0001", "VID-0002")] == small


def test_haversine() -> None:
    assert haversine_m(0, 0, 0, 1) == pytest.approx(111_195, rel=1e-3)
    assert haversine_m(47.0, 8.0, 47.0, 8.0) == 0.0


def test_report_is_self_contained_html_with_svg() -> None:
    d = ReportData(
        summary={"events": 10},
        flights_per_vehicle=[("VID-1", 3.0), ("VID-<2>", 1.0)],
        failsafe_days=["2025-06-01", "2025-06-02"],
        failsafe_series={"battery": [1.0, 0.0], "gcs": [2.0, 1.0]},
        latency_rows=[{"name": "arm", "result": "accepted", "count": 3, "latency_p50_ms": 40.0,
                       "latency_p95_ms": 90.0, "latency_p99_ms": 4000.0}],
        timelines={"VID-1": [{"time": "2025-06-01T00:00:00", "type": "armed", "summary": "armed"}]},
    )
    page = render(d)
    assert page.count("<svg") == 3
    assert "VID-&lt;2&gt;" in page and "<script" not in page and "http://" not in page.replace(
        'xmlns="http://www.w3.org/2000/svg"', ""
    )
    for svg in (bar_chart([("a", 1.0)], title="t"), stacked_columns(["d"], {"x": [1.0]}, title="t"),
                grouped_log_bars(["a"], {"p50": [5.0]}, title="t", unit="ms")):
        ElementTree.fromstring(svg)  # well-formed XML
    assert "no data" in bar_chart([], title="t")


def test_typed_only_decoding_leaves_data_null_and_the_rest_equal() -> None:
    data: dict[Any, Any] = {"mode": "AUTO", "lat_deg": 47.5, "seq": 3, "name": "arm", "armed": True,
                            "battery_pct": 7, "severity": True, "unknown_key": 1, 5: "int key"}
    payload = pack("VID-1", T0_NS, data)
    full, typed = Columns(), Columns(with_data=False)
    full.add("S", 1, "fleet.t.veh.VID-1.evt.statustext", payload)
    typed.add("S", 1, "fleet.t.veh.VID-1.evt.statustext", payload)
    a, b = _row(full), _row(typed)
    assert json.loads(str(a.pop("data")))["mode"] == "AUTO" and b.pop("data") is None
    assert a == b
    assert (b["mission_seq"], b["cmd_name"], b["battery_pct"], b["severity"]) == (3, "arm", 7.0, None)
    assert SourceOptions.from_options({"data": "false"}).data is False and SourceOptions.from_options({}).data
    with pytest.raises(ConfigError):
        SourceOptions.from_options({"data": "maybe"})


def test_reader_header_parser_gives_what_nats_py_gives() -> None:
    from nats.aio.client import Client

    from mavjet.analytics.natsread import _header_lines

    cases = [
        b"Nats-Msg-Id: VID-0001:evt:1749945600000000000\r\n\r\n",
        b"A: b\r\nBad Key: x\r\nC:\td \r\n\xff: y\r\nD: \xff\xfe\r\n",  # space in a name, non-ASCII name and value
        b"", b"no colon\r\nK:v", b"K\x1c: v\r\n", b" Padded : v \r\n", b"K: a: b\r\nK: again\r\n",
    ]
    parsed = [_header_lines(raw) for raw in cases]
    assert parsed == [Client._parse_header_lines(raw) for raw in cases]
    assert parsed[0] == {"Nats-Msg-Id": "VID-0001:evt:1749945600000000000"} and parsed[4] == {}
