"""The gateway's /metrics: names by Prometheus conventions, build_info, no `_created`, the command histogram."""

from __future__ import annotations

import dataclasses
import re
import sys
import time
from pathlib import Path
from urllib.request import urlopen

import anyio
import anyio.to_thread
from nats import errors as nats_errors
from nats.aio.client import Client
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mavjet.contract import __version__
from mavjet.gateway.commands.consumer import CommandService
from mavjet.gateway.daemon import Gateway
from mavjet.gateway.runtime.linkmetrics import FAMILIES
from mavjet.gateway.runtime.metrics import GatewayMetrics, nats_auth_reason
from mavjet.ops.client import CommandClient
from mavjet.ops.natsserver import NatsServer, free_port
from mavjet.sim.fleet import SimConfig, SimFleet
from tests.support import wait_for
from tests.support.commands import TEST_COMMANDS, ready_to_fly
from tests.support.gateway import ENV, gateway_config, running

ROOT = Path(__file__).resolve().parents[2]
# Names from before issue 16 that must be gone (docs/operations.md has the rename table).
OLD_NAMES = ("mavjet_mavlink_bad_data_total", "mavjet_mavlink_seq_gaps_total")


def families(text: str) -> dict[str, tuple[str, list[tuple[str, dict[str, str], float]]]]:
    """family name -> (type, [(sample name, labels, value)])."""
    return {f.name: (f.type, [(s.name, dict(s.labels), s.value) for s in f.samples])
            for f in text_string_to_metric_families(text)}


def test_build_info_and_no_created_series() -> None:
    gm = GatewayMetrics()
    gm.commands.labels(command="arm", result="accepted").inc()
    gm.command_duration.labels(command="arm", result="accepted").observe(0.05)
    gm.publishes.labels(kind="state", result="acked").inc()
    text = generate_latest(gm.registry).decode()
    assert "_created" not in text
    fams = families(text)
    (_, [(name, labels, value)]) = fams["mavjet_build_info"]
    assert name == "mavjet_build_info" and value == 1.0
    assert labels["version"] == __version__
    assert labels["python"] == ".".join(map(str, sys.version_info[:3]))
    assert re.fullmatch(r"\d+\.\d+.*", labels["nats_py"]) and re.fullmatch(r"\d+\.\d+.*", labels["pymavlink"])
    # Conventions: every counter sample ends in _total, histograms and timestamps are in seconds.
    for fam, (kind, samples) in fams.items():
        assert fam.startswith("mavjet_"), fam
        if kind == "counter":
            assert all(s.endswith("_total") for s, _, _ in samples), fam
        if kind == "histogram":
            assert fam.endswith("_seconds"), fam
    hist = {s for s, _, _ in fams["mavjet_command_duration_seconds"][1]}
    assert hist == {f"mavjet_command_duration_seconds_{x}" for x in ("bucket", "count", "sum")}


def test_nats_auth_errors_are_counted_apart() -> None:
    assert nats_auth_reason(nats_errors.AuthorizationError()) == "authorization"
    # What nats-py's error callback gets when a server refuses the credentials at connect.
    assert nats_auth_reason(nats_errors.Error("nats: 'Authorization Violation'")) == "authorization"
    perm = nats_errors.Error("nats: 'Permissions Violation for Publish to \"fleet.prod.veh.X.state.position\"'")
    assert nats_auth_reason(perm) == "permissions"
    assert nats_auth_reason(nats_errors.Error("nats: 'Slow Consumer'")) is None
    gm = GatewayMetrics()
    value = gm.registry.get_sample_value
    # Both reasons exist at 0 before any error, so increase() works from the first one.
    assert value("mavjet_nats_auth_errors_total", {"reason": "permissions"}) == 0.0
    for exc in (perm, perm, nats_errors.AuthorizationError(), nats_errors.Error("nats: 'Slow Consumer'")):
        gm.nats_error(exc)
    assert value("mavjet_nats_auth_errors_total", {"reason": "permissions"}) == 2.0
    assert value("mavjet_nats_auth_errors_total", {"reason": "authorization"}) == 1.0
    assert value("mavjet_errors_total", {"where": "nats"}) == 4.0


async def test_live_gateway_metrics_after_a_command(provisioned: Client, nats_server: NatsServer,
                                                    tmp_path: Path) -> None:
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=5.0)) as fleet:
        cfg = gateway_config(nats_server.url, fleet.endpoints, tmp_path / "state", commands=TEST_COMMANDS,
                             metrics_port=0)
        service = CommandService()
        gw = Gateway(cfg)
        gw.services.append(service)
        async with running(gw), CommandClient(provisioned, ENV, issuer="pytest") as client:
            await wait_for(lambda: bool(service.lanes) and all(loop.binds for loop in service.lanes.values()),
                           timeout_s=20)
            await ready_to_fly(fleet)
            t0 = time.monotonic()
            r = await client.call("VID-001", "set_mode", {"mode": "GUIDED"}, timeout_s=30)
            call_s = time.monotonic() - t0
            assert r.accepted, r
            url = f"http://127.0.0.1:{gw.metrics_port}/metrics"

            def scrape() -> str:
                with urlopen(url, timeout=5) as resp:
                    return str(resp.read().decode())

            # State goes out both plainly and (every Nth) acked; wait until both were counted.
            text = ""
            for _ in range(100):
                text = await anyio.to_thread.run_sync(scrape)
                if all(re.search(rf'mavjet_publishes_total{{kind="state",result="{r}"}} [1-9]', text)
                       for r in ("acked", "plain")):
                    break
                await anyio.sleep(0.1)
    assert "_created" not in text
    for old in OLD_NAMES:
        assert old not in text
    assert 'result="ok"' not in text and 'result="sent"' not in text
    fams = families(text)
    build = fams["mavjet_build_info"][1]
    assert len(build) == 1 and build[0][1]["version"] == __version__ and build[0][2] == 1.0
    samples = {(s, tuple(sorted(lbl.items()))): v for _, (_, ss) in fams.items() for s, lbl, v in ss}
    key = (("command", "set_mode"), ("result", "accepted"))
    assert samples[("mavjet_command_duration_seconds_count", key)] == 1.0
    assert 0.0 < samples[("mavjet_command_duration_seconds_sum", key)] < 30.0
    assert samples[("mavjet_command_duration_seconds_bucket", (*key[:1], ("le", "+Inf"), key[1]))] == 1.0
    assert samples[("mavjet_commands_total", key)] == 1.0
    # The one command's time by phase: each observed once, and together within its whole duration.
    phases = {ph: samples[("mavjet_command_phase_seconds_sum", (("phase", ph),))] for ph in ("ledger", "vehicle", "result")}
    assert all(samples[("mavjet_command_phase_seconds_count", (("phase", ph),))] == 1.0 for ph in phases)
    assert 0.0 < sum(phases.values()) <= samples[("mavjet_command_duration_seconds_sum", key)], phases
    # ... and its wait before the gateway (issued to delivered), within what the issuer waited in all.
    queue = (("phase", "queue"),)
    assert samples[("mavjet_command_phase_seconds_count", queue)] == 1.0
    assert 0.0 <= samples[("mavjet_command_phase_seconds_sum", queue)] < call_s
    # The loop-lag probe woke while the gateway ran (every 50 ms) and never saw a negative lag.
    assert samples[("mavjet_event_loop_lag_seconds_count", ())] >= 1.0
    assert samples[("mavjet_event_loop_lag_seconds_sum", ())] >= 0.0
    vid = (("vid", "VID-001"),)
    assert ("mavjet_mavlink_bad_data_runs_total", vid) in samples
    assert ("mavjet_mavlink_lost_frames_total", vid) in samples
    assert samples[("mavjet_link_up", vid)] == 1.0
    assert samples[("mavjet_publishes_total", (("kind", "state"), ("result", "acked")))] > 0
    assert samples[("mavjet_publishes_total", (("kind", "state"), ("result", "plain")))] > 0
    assert samples[("mavjet_nats_auth_errors_total", (("reason", "permissions"),))] == 0.0


def test_operations_doc_lists_every_gateway_metric() -> None:
    gm = GatewayMetrics()
    gm.spool_dropped.labels("info").inc()  # labelled families export nothing until a child exists
    gm.events.labels(type="armed").inc()
    gm.events_suppressed.labels(type="armed").inc()
    gm.publishes.labels(kind="event", result="acked").inc()
    gm.publish_latency.labels(kind="event").observe(0.01)
    gm.errors.labels(where="x").inc()
    gm.commands.labels(command="arm", result="accepted").inc()
    gm.command_duration.labels(command="arm", result="accepted").observe(0.01)
    gm.command_phase.labels(phase="vehicle").observe(0.01)
    exported = {s if not s.endswith(("_bucket", "_count", "_sum")) else f
                for f, (_, ss) in families(generate_latest(gm.registry).decode()).items() for s, _, _ in ss}
    # The per-link families are built at scrape time from live links: their names come from the source.
    src = (ROOT / "gateway" / "runtime" / "metrics.py").read_text()
    for kind, name in re.findall(r'(Counter|Gauge)MetricFamily\(\s*"(mavjet_[a-z_]+)"', src):
        exported.add(name + "_total" if kind == "Counter" else name)
    for name, kind, _help in FAMILIES:  # the link families (gateway/runtime/linkmetrics.py)
        exported.add(name + "_total" if kind == "counter" else name)
    doc = (ROOT / "docs" / "operations.md").read_text()
    section = doc.split("## Gateway metrics", 1)[1].split("Renamed in this release", 1)[0]
    documented = set(re.findall(r"`(mavjet_[a-z_]+)`", section))
    assert documented == exported, (documented - exported, exported - documented)


async def test_refused_credentials_are_counted(tmp_path: Path) -> None:
    srv = NatsServer(store_dir=str(tmp_path / "js"), log_file=str(tmp_path / "nats.log"),
                     extra_args=["--user", "alice", "--pass", "right-password"])
    srv.start()
    try:
        url = f"nats://alice:wrong-password@{srv.host}:{srv.port}"
        cfg = gateway_config(url, [f"tcp:127.0.0.1:{free_port()}"], tmp_path / "state")
        gw = Gateway(dataclasses.replace(cfg, startup_timeout_s=1.0))  # it never gets NATS: don't wait 10 s for it
        value = gw.metrics.registry.get_sample_value
        async with anyio.create_task_group() as tg:
            tg.start_soon(gw.run)
            await wait_for(lambda: (value("mavjet_nats_auth_errors_total", {"reason": "authorization"}) or 0) >= 1,
                           timeout_s=20)
            gw.request_stop("test done")
        assert value("mavjet_nats_connected") == 0.0
        assert value("mavjet_nats_auth_errors_total", {"reason": "permissions"}) == 0.0
    finally:
        srv.cleanup()
