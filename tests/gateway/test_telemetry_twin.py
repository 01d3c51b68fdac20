"""The telemetry twin end to end: sim vehicles over TCP -> gateway -> real nats-server."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from urllib.request import urlopen

import anyio
import anyio.to_thread
from nats.aio.client import Client
from prometheus_client.parser import text_string_to_metric_families

from mavjet.contract.natsconn import open_client
from mavjet.drivers.mavlink.dialect import mavlink2 as m
from mavjet.gateway.twin.telemetry import TelemetryModel
from mavjet.ops.natsserver import NatsServer
from mavjet.ops.read import current_state
from mavjet.sim.fleet import SimConfig, SimFleet
from tests.support import (
    ENV,
    collect_events,
    gateway_config,
    running_gateway,
    wait_for,
    wait_for_async,
)
from tests.support.compiled import interpreted_only


async def _command(gw: object, vid: str, command: int, *params: float) -> None:
    twin = gw.twins[vid]  # type: ignore[attr-defined]
    p = list(params) + [0.0] * (7 - len(params))
    await twin.link.send(m.MAVLink_command_long_message(twin.link.target_system, 1, command, 0, *p))


async def _count(js: object, subject: str) -> int:
    info = await js.stream_info("TWIN_STATE", subjects_filter=subject)  # type: ignore[attr-defined]
    return int((info.state.subjects or {}).get(subject, 0))


async def test_fleet_state_at_configured_rates(provisioned: Client, nats_server: NatsServer, fleet3: SimFleet,
                                               tmp_path: Path) -> None:
    cfg = gateway_config(nats_server.url, fleet3.endpoints, tmp_path / "state", metrics_port=0)
    async with running_gateway(cfg) as gw:
        js = provisioned.jetstream()
        channels = {"position", "attitude", "battery", "gps", "status", "link"}

        async def complete() -> bool:
            st = await current_state(js, ENV)
            complete = {(v, c) for v, c in st} >= {(f"VID-00{i}", c) for i in (1, 2, 3) for c in channels}
            return complete and all(st[(f"VID-00{i}", "link")].data["state"] == "up" for i in (1, 2, 3))

        await wait_for_async(complete, timeout_s=30)
        st = await current_state(js, ENV)
        assert st[("VID-002", "status")].data["flavour"] == "ardupilot"
        assert st[("VID-001", "link")].data["state"] == "up"
        # Rates: count stored position and battery samples over a window.
        before = {ch: await _count(js, f"fleet.{ENV}.veh.VID-001.state.{ch}") for ch in ("position", "battery")}
        t0 = time.monotonic()
        await asyncio.sleep(3.0)
        dt = time.monotonic() - t0
        after = {ch: await _count(js, f"fleet.{ENV}.veh.VID-001.state.{ch}") for ch in ("position", "battery")}
        pos_hz = (after["position"] - before["position"]) / dt
        bat_hz = (after["battery"] - before["battery"]) / dt
        assert 6.0 <= pos_hz <= 11.0, pos_hz
        assert 0.5 <= bat_hz <= 1.6, bat_hz
        # Metrics endpoint reports MAVLink counts per vehicle and the NATS connection.
        assert gw.metrics_port
        url = f"http://127.0.0.1:{gw.metrics_port}/metrics"
        body = await anyio.to_thread.run_sync(lambda: urlopen(url, timeout=5).read().decode())
        per_vehicle = _sample(body, "mavjet_mavlink_messages_total", vid="VID-003")
        fleet_positions = _sample(body, "mavjet_mavlink_messages_by_type_total", type="GLOBAL_POSITION_INT")
        assert fleet_positions > per_vehicle / 3 > 0  # three vehicles, two thirds of their traffic positions
        assert 'type="GLOBAL_POSITION_INT",vid=' not in body  # no (vehicle, type) series: 15 a vehicle
        assert "mavjet_nats_connected 1.0" in body
        assert 'mavjet_link_up{vid="VID-001"} 1.0' in body


async def test_flight_events_exactly_once(provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    # A late GPS fix (10 s sim time) so the gateway sees the fix change happen.
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=5.0, gps_fix_s=10.0, ekf_settle_s=12.0)) as fleet:
        v = fleet.vehicles[0]
        cfg = gateway_config(nats_server.url, fleet.endpoints, tmp_path / "state")
        async with running_gateway(cfg) as gw:
            await wait_for(lambda: gw.twins["VID-001"].model.fix_type == 3 and gw.twins["VID-001"].model.home, 30)
            await asyncio.sleep(1.0)  # EKF settle (sim time, sped up)
            await _command(gw, "VID-001", m.MAV_CMD_DO_SET_MODE, 1, 4)  # GUIDED
            await wait_for(lambda: v.mode == "GUIDED")
            await wait_for_async(lambda: _arm(gw), timeout_s=20)
            await _command(gw, "VID-001", m.MAV_CMD_NAV_TAKEOFF, 0, 0, 0, 0, 0, 0, 10)
            await wait_for(lambda: v.alt_m > 8.0, 30)
            await _command(gw, "VID-001", m.MAV_CMD_NAV_LAND)
            await wait_for(lambda: not v.armed, 60)
            await asyncio.sleep(1.0)
        events = await collect_events(provisioned)
    types = [t for _, t, _, _ in events]
    for expected in ("gateway_started", "gps_fix_changed", "home_set", "mode_changed", "armed", "takeoff",
                     "landed", "disarmed", "gateway_stopped"):
        assert expected in types, (expected, types)
    assert types.count("armed") == 1 and types.count("takeoff") == 1 and types.count("landed") == 1
    assert types.index("armed") < types.index("takeoff") < types.index("landed") < types.index("disarmed")
    ids = [i for *_, i in events]
    assert len(ids) == len(set(ids)) and all(i.startswith("VID-001:") for i in ids)
    landed = next(d for _, t, d, _ in events if t == "landed")
    assert landed["max_alt_m"] >= 8.0


async def _arm(gw: object) -> bool:
    twin = gw.twins["VID-001"]  # type: ignore[attr-defined]
    if twin.model.armed:
        return True
    await _command(gw, "VID-001", m.MAV_CMD_COMPONENT_ARM_DISARM, 1)
    await asyncio.sleep(0.5)
    return bool(twin.model.armed)


async def test_failsafe_statustext_and_link_events(provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=5.0)) as fleet:
        v = fleet.vehicles[0]
        cfg = gateway_config(nats_server.url, fleet.endpoints, tmp_path / "state")
        async with running_gateway(cfg) as gw:
            twin = gw.twins["VID-001"]
            await wait_for(lambda: twin.model.fix_type == 3 and twin.model.home, 30)
            await asyncio.sleep(1.0)
            await _command(gw, "VID-001", m.MAV_CMD_DO_SET_MODE, 1, 4)
            await wait_for_async(lambda: _arm(gw), timeout_s=20)
            await _command(gw, "VID-001", m.MAV_CMD_NAV_TAKEOFF, 0, 0, 0, 0, 0, 0, 10)
            await wait_for(lambda: v.alt_m > 5.0, 30)
            v.set_battery_pct(5.0)
            await wait_for(lambda: twin.model.failsafe_active, 20)
            await wait_for(lambda: v.mode in ("RTL", "LAND"), 10)
            v.drop_link(3.0)
            await wait_for(lambda: not twin.link.is_up, 15)
            await wait_for(lambda: twin.link.is_up, 20)
            await asyncio.sleep(0.5)
        events = await collect_events(provisioned)
    types = [t for _, t, _, _ in events]
    fs = [d for _, t, d, _ in events if t == "failsafe"]
    assert len(fs) == 1 and fs[0]["failsafe_type"] == "battery", fs
    assert any(t == "statustext" and "failsafe" in d["text"].lower() for _, t, d, _ in events)
    assert types.count("link_lost") == 1 and types.count("link_restored") == 1
    restored = next(d for _, t, d, _ in events if t == "link_restored")
    assert restored["outage_s"] > 1.0


async def test_garbage_and_corruption_do_not_disturb_other_vehicles(
    provisioned: Client, nats_server: NatsServer, fleet3: SimFleet, tmp_path: Path
) -> None:
    cfg = gateway_config(nats_server.url, fleet3.endpoints, tmp_path / "state")
    async with running_gateway(cfg) as gw:
        bad, good = gw.twins["VID-001"], gw.twins["VID-002"]
        await wait_for(lambda: good.link.codec.stats.by_type.get("GLOBAL_POSITION_INT", 0) > 10, 20)
        fleet3.vehicles[0].corrupt = 0.3
        for _ in range(5):
            fleet3.vehicles[0].inject_garbage(2000)
            await asyncio.sleep(0.2)
        await wait_for(lambda: bad.link.codec.stats.crc_errors > 5, 20)
        n_good = good.link.codec.stats.messages_in
        await asyncio.sleep(1.0)
        assert good.link.codec.stats.messages_in > n_good + 5  # VID-002 unaffected
        assert good.link.codec.stats.crc_errors == 0
        fleet3.vehicles[0].corrupt = 0.0
        n_bad = bad.link.codec.stats.messages_in
        await wait_for(lambda: bad.link.codec.stats.messages_in > n_bad + 20, 20)  # VID-001 recovers
        assert bad.link.is_up


async def test_nats_restart_under_running_gateway(provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=5.0)) as fleet:
        cfg = gateway_config(nats_server.url, fleet.endpoints, tmp_path / "state")
        async with running_gateway(cfg) as gw:
            twin = gw.twins["VID-001"]
            await wait_for(lambda: gw.publisher.state_published > 20, 20)
            nats_server.stop()
            await wait_for(lambda: not gw.publisher.is_connected, 10)
            # An event during the outage goes to the spool, not lost.
            twin.emit("statustext", severity=4, severity_name="warning", text="during outage")
            await wait_for(lambda: gw.spool.depth >= 1, 5)
            published = gw.publisher.state_published
            nats_server.start()
            await wait_for(lambda: gw.publisher.is_connected, 30)
            await wait_for(lambda: gw.spool.depth == 0, 20)
            await wait_for(lambda: gw.publisher.state_published > published + 20, 20)
        await anyio.sleep(0.2)

    nc = await open_client(nats_server.url)
    try:
        events = await collect_events(nc)
    finally:
        await nc.close()
    texts = [d.get("text") for _, t, d, _ in events if t == "statustext"]
    assert texts.count("during outage") == 1


async def test_nats_unreachable_at_start_then_spool_flushes(nats_server: NatsServer, tmp_path: Path) -> None:
    nats_server.stop()
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=5.0)) as fleet:
        cfg = gateway_config(nats_server.url, fleet.endpoints, tmp_path / "state")
        async with running_gateway(cfg) as gw:
            twin = gw.twins["VID-001"]
            assert twin.link.is_up and not gw.publisher.is_connected  # MAVLink flows without NATS
            await wait_for(lambda: gw.spool.depth >= 1, 10)  # gateway_started at least
            nats_server.start()

            from mavjet.ops.provision import DEFINITIONS_DIR, load_definitions, provision

            nc = await open_client(nats_server.url)
            await provision(nc.jetstream(), load_definitions(DEFINITIONS_DIR, env=ENV, replicas=1))
            await wait_for(lambda: gw.publisher.is_connected, 30)
            await wait_for(lambda: gw.spool.depth == 0, 30)
            # What the vehicle said while no owner could be known was kept and is published now; then,
            # with the lease bucket there, the gateway owns the vehicle and says it serves it.
            stored = {(v, t) for v, t, _, _ in await collect_events(nc)}
            assert ("VID-001", "home_set") in stored or ("VID-001", "statustext") in stored, stored

            async def started() -> bool:
                return ("VID-001", "gateway_started") in {(v, t) for v, t, _, _ in await collect_events(nc)}

            await wait_for_async(started, 30)
        await nc.close()


@interpreted_only("mavjet.gateway.twin.telemetry")  # subclasses TelemetryModel
async def test_px4_flavour_and_a_crashing_vehicle_task(provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    async with SimFleet(SimConfig(vehicles=2, base_port=0, speedup=4.0, flavour="px4")) as fleet:
        cfg = gateway_config(nats_server.url, fleet.endpoints, tmp_path / "state")
        async with running_gateway(cfg) as gw:
            a, b = gw.twins["VID-001"], gw.twins["VID-002"]
            await wait_for(lambda: a.model.flavour == "px4" and a.model.mode is not None, 20)
            assert a.model.modes is not None and a.model.modes.custom_mode(a.model.mode) >= 1 << 16
            # A bug in one vehicle's message handling is contained and counted.
            boom = {"n": 0}

            class Broken(TelemetryModel):
                def update(self, msg: object, recv_ns: int) -> None:
                    boom["n"] += 1
                    raise RuntimeError("injected bug")

                def update_many(self, msgs: list[object], recv_ns: int) -> None:  # the twin's batch entry
                    for msg in msgs:
                        self.update(msg, recv_ns)

            a.model = Broken(vid="VID-001")
            n_b = b.link.codec.stats.messages_in
            await wait_for(lambda: boom["n"] > 10 and b.link.codec.stats.messages_in > n_b + 10, 20)
            assert a.link.is_up and b.link.is_up
            assert gw.metrics.errors.labels(where="telemetry")._value.get() > 0


async def test_streams_fall_back_to_request_data_stream(provisioned: Client, nats_server: NatsServer,
                                                        tmp_path: Path) -> None:
    """An autopilot that refuses SET_MESSAGE_INTERVAL still gets its streams, through REQUEST_DATA_STREAM."""
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=2.0)) as fleet:
        v = fleet.vehicles[0]
        v.reject_next(m.MAV_CMD_SET_MESSAGE_INTERVAL, m.MAV_RESULT_UNSUPPORTED, count=100)
        cfg = gateway_config(nats_server.url, fleet.endpoints, tmp_path / "state")
        async with running_gateway(cfg) as gw:
            twin = gw.twins["VID-001"]
            await wait_for(lambda: twin.link.codec.stats.by_type.get("GLOBAL_POSITION_INT", 0) > 20, 20)
            assert twin.link.streams.interval_supported is False
            assert any(e.command == m.MAV_CMD_SET_MESSAGE_INTERVAL and not e.executed for e in v.executions)
            await wait_for(lambda: "position" in twin.model.channels and "attitude" in twin.model.channels, 10)


def _sample(body: str, name: str, **labels: str) -> float:
    (value,) = [s.value for fam in text_string_to_metric_families(body) for s in fam.samples
                if s.name == name and s.labels == labels]
    return float(value)
