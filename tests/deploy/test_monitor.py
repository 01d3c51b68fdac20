"""Stream health: thresholds, the Prometheus exporter against a real server, and rules.yml."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.js import api as jsapi
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mavjet.contract.natsconn import open_client
from mavjet.ops.health import (
    ConsumerHealth,
    Health,
    ReplicaHealth,
    StreamHealth,
    Thresholds,
    evaluate,
)
from mavjet.ops.monitor import HealthCollector
from mavjet.ops.natsserver import NatsServer, free_port
from tests.support import wait_for_async

from . import yamlsubset

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
RULES_TEST = ROOT / "deploy" / "prometheus" / "rules_test.yml"
GATEWAY_RULES = ROOT / "deploy" / "prometheus" / "gateway_rules.yml"
GATEWAY_RULES_TEST = ROOT / "deploy" / "prometheus" / "gateway_rules_test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "mavjet-fleet.json"


def sample_health(*, pending: int = 0, ack_pending: int = 0, used: int = 0, lag: int = 0,
                  current: bool = True, leader: str | None = "n1") -> Health:
    return Health(
        streams=(StreamHealth(stream="TWIN_STATE", messages=10, bytes=used, max_bytes=1000, replicas=3,
                              leader=leader, clustered=True),
                 StreamHealth(stream="TWIN_CMD", messages=0, bytes=0, max_bytes=-1, replicas=3,
                              leader="n1", clustered=True)),
        consumers=(ConsumerHealth(stream="TWIN_CMD", consumer="gw-VID-001", num_pending=pending,
                                  num_ack_pending=ack_pending, num_redelivered=0, num_waiting=1),),
        replicas=(ReplicaHealth(stream="TWIN_STATE", peer="n2", current=current, offline=False, lag=lag),),
    )


def test_thresholds_are_the_seeds() -> None:
    t = Thresholds()
    assert (t.consumer_lag_msgs, t.bytes_ratio, t.ack_pending_msgs) == (10_000, 0.8, 1_000)


def test_evaluate_at_and_over_thresholds() -> None:
    assert evaluate(sample_health(pending=10_000, ack_pending=1_000, used=800)) == []
    kinds = sorted(p.kind for p in evaluate(sample_health(pending=10_001, ack_pending=1_001, used=801, lag=3)))
    assert kinds == ["ack_pending", "consumer_lag", "replica_behind", "stream_bytes"]
    assert [p.kind for p in evaluate(sample_health(current=False))] == ["replica_behind"]
    assert [p.subject for p in evaluate(sample_health(leader=None))] == ["TWIN_STATE"]
    # The unlimited stream (max_bytes -1) never trips the bytes check.
    assert all(p.subject != "TWIN_CMD" for p in evaluate(sample_health(used=10**9)))


def exported(health: Health | None) -> dict[str, list[tuple[dict[str, str], float]]]:
    collector = HealthCollector(Thresholds())
    collector.update(health)
    reg = CollectorRegistry()
    reg.register(collector)
    return parse_metrics(generate_latest(reg).decode())


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def test_exported_metrics() -> None:
    m = exported(sample_health(pending=7, ack_pending=3, used=250, lag=2))
    assert m["mavjet_monitor_up"] == [({}, 1.0)]
    assert ({"stream": "TWIN_STATE"}, 0.25) in m["mavjet_stream_bytes_ratio"]
    assert all(lbl["stream"] != "TWIN_CMD" for lbl, _ in m["mavjet_stream_bytes_ratio"])
    assert m["mavjet_consumer_pending_messages"] == [({"stream": "TWIN_CMD", "consumer": "gw-VID-001"}, 7.0)]
    assert m["mavjet_consumer_ack_pending_messages"][0][1] == 3.0
    assert m["mavjet_stream_replica_lag"] == [({"stream": "TWIN_STATE", "peer": "n2"}, 2.0)]
    assert m["mavjet_threshold_consumer_lag_messages"] == [({}, 10_000.0)]
    down = exported(None)
    assert down["mavjet_monitor_up"] == [({}, 0.0)] and "mavjet_stream_bytes" not in down


def rule_exprs(path: Path = RULES) -> dict[str, str]:
    doc = yamlsubset.loads(path.read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    for r in rules:
        assert set(r) <= {"alert", "expr", "for", "labels", "annotations"}, r
        assert r["labels"]["severity"] in ("warning", "critical")
        assert re.fullmatch(r"\d+[smh]", r["for"])
        assert r["annotations"]["summary"]
    return {r["alert"]: r["expr"] for r in rules}


def test_rules_match_thresholds_and_exported_metrics() -> None:
    exprs = rule_exprs()
    t = Thresholds()
    assert exprs["MavjetConsumerLag"] == f"mavjet_consumer_pending_messages > {t.consumer_lag_msgs}"
    assert exprs["MavjetStreamBytesHigh"] == f"mavjet_stream_bytes_ratio > {t.bytes_ratio}"
    assert exprs["MavjetAckPending"] == f"mavjet_consumer_ack_pending_messages > {t.ack_pending_msgs}"
    replica = exprs["MavjetReplicaBehind"]
    assert "mavjet_stream_replica_current == 0" in replica and "mavjet_stream_replica_lag > 0" in replica
    # Every mavjet_* metric a rule or the dashboard uses is one the monitor exports.
    names = set(exported(sample_health(pending=1, ack_pending=1, used=1, lag=1)))
    used = set(re.findall(r"\bmavjet_[a-z_]+", " ".join(exprs.values())))
    assert used and used <= names, used - names


def find_promtool() -> str | None:
    """On PATH, or next to this Python (CI unpacks it into the venv's bin without activating the venv)."""
    beside = Path(sys.executable).parent / "promtool"  # not resolved: the venv's bin, not the base Python's
    return shutil.which("promtool") or (str(beside) if os.access(beside, os.X_OK) else None)


PROMTOOL = find_promtool()
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian package 'prometheus'); structure checked above")


@needs_promtool
def test_promtool_check_and_unit_test_rules() -> None:
    assert PROMTOOL is not None
    out = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 6 rules found" in out.stdout
    out = subprocess.run([PROMTOOL, "test", "rules", RULES_TEST.name], capture_output=True, text=True,
                         timeout=60, check=False, cwd=RULES_TEST.parent)
    assert out.returncode == 0, out.stdout + out.stderr


GATEWAY_ALERTS = {"MavjetVehicleLinkDown", "MavjetNatsUnreachable", "MavjetSpoolDropping", "MavjetGatewayLoopStalled",
                  "MavjetNatsAuthErrors", "MavjetSigningRejected", "MavjetGatewayDown"}


def test_gateway_rules_use_gateway_metrics() -> None:
    exprs = rule_exprs(GATEWAY_RULES)
    assert set(exprs) == GATEWAY_ALERTS
    used = set(re.findall(r"\bmavjet_[a-z_]+", " ".join(exprs.values())))
    assert used and used <= gateway_metric_names(), used - gateway_metric_names()
    assert exprs["MavjetSpoolDropping"] == "rate(mavjet_spool_dropped_total[5m]) > 0"
    # The loop-stall limit is the container HEALTHCHECK's.
    containerfile = (ROOT / "deploy" / "container" / "Containerfile").read_text()
    limit = re.search(r"mavjet_loop_last_tick_timestamp_seconds=(\d+)", containerfile)
    assert limit and exprs["MavjetGatewayLoopStalled"].endswith(f"> {limit.group(1)}")
    # Every alert has a unit test that sees it fire and one that sees it quiet.
    tests = yamlsubset.loads(GATEWAY_RULES_TEST.read_text())["tests"]
    cases = [c for t in tests for c in t["alert_rule_test"]]
    assert {c["alertname"] for c in cases if c["exp_alerts"]} == GATEWAY_ALERTS
    assert {c["alertname"] for c in cases if not c["exp_alerts"]} == GATEWAY_ALERTS


@needs_promtool
def test_promtool_gateway_rules() -> None:
    assert PROMTOOL is not None
    out = subprocess.run([PROMTOOL, "check", "rules", str(GATEWAY_RULES)], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(GATEWAY_ALERTS)} rules found" in out.stdout
    out = subprocess.run([PROMTOOL, "test", "rules", GATEWAY_RULES_TEST.name], capture_output=True, text=True,
                         timeout=60, check=False, cwd=GATEWAY_RULES_TEST.parent)
    assert out.returncode == 0, out.stdout + out.stderr


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
        return parse_metrics(resp.read().decode())


async def test_monitor_exports_live_health(provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    js = provisioned.jetstream()
    await js.add_consumer("TWIN_CMD", jsapi.ConsumerConfig(
        durable_name="gw-VID-001", filter_subject="fleet.test.veh.VID-001.cmd.>",
        ack_policy=jsapi.AckPolicy.EXPLICIT, ack_wait=60.0))
    for i in range(5):
        await js.publish("fleet.test.veh.VID-001.cmd.arm", b"x", headers={"Nats-Msg-Id": f"c{i}"})
    sub = await js.pull_subscribe_bind("gw-VID-001", stream="TWIN_CMD")
    taken = await sub.fetch(2, timeout=2)  # delivered, not acked
    assert len(taken) == 2

    port = free_port()
    log = (tmp_path / "monitor.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "mavjet.ops", "monitor", "--nats", nats_server.url, "--env", "test",
        "--listen", f"127.0.0.1:{port}", "--interval", "200ms", "--timeout", "1s",
        stdout=log, stderr=log)
    try:
        def has_consumer() -> bool:
            m = scrape(port)
            return any(lbl.get("consumer") == "gw-VID-001" for lbl, _ in m.get("mavjet_consumer_pending_messages", []))

        await wait_for_async(lambda: asyncio.to_thread(has_consumer), 20.0, 0.1, what="consumer metrics", ignore=(OSError,))
        m = scrape(port)
        key = {"stream": "TWIN_CMD", "consumer": "gw-VID-001"}
        assert (key, 3.0) in m["mavjet_consumer_pending_messages"]
        assert (key, 2.0) in m["mavjet_consumer_ack_pending_messages"]
        streams = {lbl["stream"] for lbl, _ in m["mavjet_stream_messages"]}
        assert streams == {"TWIN_STATE", "TWIN_EVENTS", "TWIN_CMD", "KV_TWIN_SHADOW", "OBJ_TWIN_BLOBS", "TWIN_LOGS", "TWIN_TRACKS",
                           "KV_TWIN_LEASES", "KV_TWIN_ROLLOUTS"}
        assert ({"stream": "TWIN_CMD"}, 5.0) in m["mavjet_stream_messages"]
        assert any(lbl == {"stream": "TWIN_EVENTS"} for lbl, _ in m["mavjet_stream_bytes_ratio"])
        assert m["mavjet_monitor_up"] == [({}, 1.0)]

        # NATS goes away: the exporter keeps serving and says so; then it recovers.
        nats_server.stop()
        await wait_for_async(lambda: asyncio.to_thread(lambda: scrape(port)["mavjet_monitor_up"] == [({}, 0.0)]), 20.0, 0.1,
                             what="monitor_up 0", ignore=(OSError,))
        assert "mavjet_consumer_pending_messages" not in scrape(port)
        nats_server.start()
        await wait_for_async(lambda: asyncio.to_thread(lambda: scrape(port)["mavjet_monitor_up"] == [({}, 1.0)]), 30.0, 0.1,
                             what="monitor_up back to 1", ignore=(OSError,))
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 10)
        log.close()


def test_monitor_once_reports_crossed_thresholds(nats_server: NatsServer) -> None:
    async def setup() -> None:

        nc = await open_client(nats_server.url)
        try:
            from mavjet.ops.provision import DEFINITIONS_DIR, load_definitions, provision

            js = nc.jetstream()
            await provision(js, load_definitions(DEFINITIONS_DIR, env="test", replicas=1))
            await js.add_consumer("TWIN_CMD", jsapi.ConsumerConfig(
                durable_name="gw-VID-002", filter_subject="fleet.test.veh.VID-002.cmd.>",
                ack_policy=jsapi.AckPolicy.EXPLICIT, ack_wait=60.0, max_ack_pending=5000))
            acks = [await js.publish_async("fleet.test.veh.VID-002.cmd.goto", b"x") for _ in range(1001)]
            await asyncio.gather(*acks)
            sub = await js.pull_subscribe_bind("gw-VID-002", stream="TWIN_CMD")
            got = 0
            for _ in range(20):
                got += len(await sub.fetch(1001 - got, timeout=2))
                if got >= 1001:
                    break
            assert got == 1001
        finally:
            await nc.close()

    exe = [sys.executable, "-m", "mavjet.ops", "monitor", "--once", "--nats", nats_server.url]
    # Nothing provisioned yet: healthy (no streams at all), exit 0.
    ok = subprocess.run(exe, capture_output=True, text=True, timeout=60, check=False)
    assert ok.returncode == 0 and "problems: none" in ok.stdout, ok.stdout + ok.stderr
    asyncio.run(setup())
    bad = subprocess.run(exe, capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert re.search(r"ack_pending\s+TWIN_CMD/gw-VID-002: 1001 unacknowledged > 1000", bad.stdout)


def gateway_metric_names() -> set[str]:
    """Every series name the gateway's /metrics can expose."""
    from mavjet.gateway.runtime.linkmetrics import FAMILIES
    from mavjet.gateway.runtime.metrics import GatewayMetrics

    gm = GatewayMetrics()
    gm.events.labels(type="armed").inc()
    gm.publishes.labels(kind="event", result="acked").inc()
    gm.commands.labels(command="arm", result="accepted").inc()
    gm.command_duration.labels(command="arm", result="accepted").observe(0.1)
    gm.command_phase.labels(phase="queue").observe(0.01)
    gm.errors.labels(where="x").inc()
    gm.publish_latency.labels(kind="evt").observe(0.01)
    gm.spool_dropped.labels("info").inc()
    names = set(parse_metrics(generate_latest(gm.registry).decode()))
    # Per-link families are built at scrape time from live links: read their names from the source.
    src = (ROOT / "gateway" / "runtime" / "metrics.py").read_text()
    for kind, name in re.findall(r'(Counter|Gauge)MetricFamily\(\s*"(mavjet_[a-z_]+)"', src):
        names.add(name + "_total" if kind == "Counter" else name)
    for name, kind, _help in FAMILIES:  # the link families (gateway/runtime/linkmetrics.py)
        names.add(name + "_total" if kind == "counter" else name)
    return names


def test_dashboard_uses_only_exported_metrics() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "mavjet-fleet" and dash["panels"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    used = set(re.findall(r"\bmavjet_[a-z_]+", " ".join(exprs)))
    known = gateway_metric_names() | set(exported(sample_health(pending=1, ack_pending=1, used=1, lag=1)))
    assert used - known == set(), used - known
    # Stream health and fleet panels are both there, and the thresholds shown are the alert thresholds.
    assert {"mavjet_consumer_pending_messages", "mavjet_stream_bytes_ratio", "mavjet_stream_replica_lag",
            "mavjet_consumer_ack_pending_messages", "mavjet_link_up"} <= used
    t = Thresholds()
    by_title = {p["title"]: p for p in dash["panels"]}
    steps = {title: p["fieldConfig"]["defaults"]["thresholds"]["steps"][-1]["value"]
             for title, p in by_title.items() if "thresholds" in p.get("fieldConfig", {}).get("defaults", {})}
    assert steps["Consumer lag (alert > 10,000)"] == t.consumer_lag_msgs
    assert steps["Ack pending (alert > 1,000)"] == t.ack_pending_msgs
    assert steps["Stream bytes / max_bytes (alert > 80%)"] == t.bytes_ratio
    # The dashboard panels don't overlap on the grid.
    cells: set[tuple[int, int]] = set()
    for p in dash["panels"]:
        g = p["gridPos"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not (cells & mine), p["title"]
        cells |= mine


def vid_metric_names() -> set[str]:
    """The gateway's series that carry a `vid` label (built at scrape time from live links: read from the source)."""
    src = (ROOT / "gateway" / "runtime" / "metrics.py").read_text()
    out = set()
    for kind, name, labels in re.findall(
            r'(Counter|Gauge)MetricFamily\(\s*"(mavjet_[a-z_]+)"[\s\S]{0,300}?labels=\[([^\]]*)\]', src):
        if '"vid"' in labels:
            out.add(name + "_total" if kind == "Counter" else name)
    from mavjet.gateway.runtime.linkmetrics import BY_TYPE, FAMILIES

    out |= {name + "_total" if kind == "counter" else name for name, kind, _ in FAMILIES if name != BY_TYPE}
    return out


def test_dashboard_vid_variable_filters_every_vehicle_panel() -> None:
    dash = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    vid = variables["vid"]
    assert vid["type"] == "query" and vid["multi"] and vid["includeAll"] and vid["allValue"] == ".*"
    assert vid["query"]["query"] == vid["definition"] == "label_values(mavjet_link_up, vid)"
    per_vehicle = vid_metric_names()
    assert {"mavjet_link_up", "mavjet_heartbeat_age_seconds", "mavjet_mavlink_crc_errors_total",
            "mavjet_mavlink_lost_frames_total", "mavjet_mavlink_signing_rejected_total"} <= per_vehicle
    filtered = 0
    for p in dash["panels"]:
        for t in p.get("targets", []):
            for name, selector in re.findall(r"\b(mavjet_[a-z_]+)(\{[^}]*\})?", t["expr"]):
                if name.removesuffix("_bucket") in per_vehicle:
                    assert 'vid=~"$vid"' in selector, (p["title"], t["expr"])
                    filtered += 1
    assert filtered >= 6
