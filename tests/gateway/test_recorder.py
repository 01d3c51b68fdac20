"""The flight recorder (gateway/stores/recorder.py): TWIN_TRACKS while armed, on real peers.

A sim vehicle over loopback TCP, the in-process gateway and a real
nats-server: samples come at about `track_hz` only while the vehicle is
armed, the first and last at the armed and disarmed events, through a NATS
outage; `track_hz = 0` records nothing; a server without TWIN_TRACKS holds
back no event, and the samples wait until the stream exists.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgpack
import pytest
from nats.aio.client import Client
from nats.js import api as jsapi

from mavjet.contract.envelope import unpack
from mavjet.contract.errors import ConfigError
from mavjet.contract.natsconn import open_client
from mavjet.contract.subjects import TRACKS_STREAM, track_subject
from mavjet.contract.tracks import encode_sample, track_msg_id, track_sample
from mavjet.drivers.mavlink.dialect import mavlink2 as m
from mavjet.gateway.config import GatewayConfig
from mavjet.gateway.daemon import Gateway
from mavjet.gateway.resolve import ENV_TRACK_HZ, build_config, resolve_config
from mavjet.gateway.stores.recorder import TRACKS_SPOOL, TrackRecorder
from mavjet.ops.natsserver import NatsServer
from mavjet.ops.provision import DEFINITIONS_DIR, load_definitions, provision
from mavjet.sim.fleet import SimConfig, SimFleet
from tests.support import ENV, collect_events, gateway_config, running, wait_for, wait_for_async

POS = {"lat_deg": 47.3977419, "lon_deg": 8.5455938, "alt_m": 12.345, "alt_msl_m": 500.123,
       "groundspeed_m_s": 4.567, "heading_deg": 123.45, "vn_m_s": 1.0, "time_boot_ms": 123456}
BATTERY = {"remaining_pct": 87.0, "voltage_v": 12.134, "current_a": 3.2}


# -- pure ---------------------------------------------------------------------------

def test_sample_encoding_is_a_compact_envelope() -> None:
    data = track_sample(POS, BATTERY, armed=True)
    assert data == {"lat_deg": 47.3977419, "lon_deg": 8.5455938, "alt_m": 12.35, "alt_msl_m": 500.12,
                    "groundspeed_m_s": 4.57, "heading_deg": 123, "battery_pct": 87, "voltage_v": 12.13,
                    "armed": True}
    payload = encode_sample("VID-001", 1_750_000_000_123_456_789, data)
    env = unpack(payload)
    assert env.vid == "VID-001" and env.time_ns == 1_750_000_000_123_456_789 and env.data == data
    # whole numbers travel as msgpack ints (1 byte for 0..127), positions as full doubles
    raw = msgpack.unpackb(payload, raw=False)
    assert type(raw["data"]["battery_pct"]) is int and type(raw["data"]["lat_deg"]) is float
    assert len(payload) <= 190, len(payload)  # docs/analytics.md (Flight recorder) counts 183 bytes a sample
    # unknown values are left out, not sent as nil
    sparse = track_sample({"lat_deg": 1.0, "lon_deg": 2.0, "alt_m": None, "heading_deg": None}, None, armed=False)
    assert sparse == {"lat_deg": 1.0, "lon_deg": 2.0, "armed": False}
    assert track_msg_id("VID-001", 5) == track_msg_id("VID-001", 5) != track_msg_id("VID-002", 5)
    assert track_subject("prod", "VID-001") == "fleet.prod.veh.VID-001.track"


def test_track_hz_is_configured_flag_over_env_over_file(tmp_path: Path) -> None:
    veh = {"vehicles": [{"vid": "VID-001", "endpoint": "tcp:127.0.0.1:5760"}]}
    assert build_config(veh).track_hz == 1.0
    assert build_config({**veh, "track_hz": 0}).track_hz == 0.0
    file_cfg = {**veh, "track_hz": 2}
    assert resolve_config(file_cfg, flags={}, environ={}).track_hz == 2.0
    assert resolve_config(file_cfg, flags={}, environ={ENV_TRACK_HZ: "0.5"}).track_hz == 0.5
    assert resolve_config(file_cfg, flags={"track_hz": 5.0}, environ={ENV_TRACK_HZ: "0.5"}).track_hz == 5.0
    for bad in (-1, 0.001, 50):
        with pytest.raises(ConfigError, match="track_hz"):
            build_config({**veh, "track_hz": bad})
    with pytest.raises(ConfigError, match=ENV_TRACK_HZ):
        resolve_config(veh, flags={}, environ={ENV_TRACK_HZ: "fast"})
    with pytest.raises(ConfigError, match="track_hz"):
        build_config({**veh, "track_hz": "1"})


def test_bad_rate_exits_2_with_one_line(tmp_path: Path) -> None:
    base = [sys.executable, "-m", "mavjet.ops", "gateway", "--vehicle", "VID-001=tcp:127.0.0.1:9",
            "--state-dir", str(tmp_path)]
    for extra, env, key in ((["--track-hz", "50"], {}, "track_hz"), ([], {ENV_TRACK_HZ: "fast"}, ENV_TRACK_HZ)):
        out = subprocess.run(base + extra, capture_output=True, text=True, timeout=60, check=False,
                             env={**os.environ, **env})
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert f"config {key}:" in out.stderr


def test_stream_definition_and_presets() -> None:
    defs = {d.name: d for d in load_definitions(DEFINITIONS_DIR, env="prod", replicas=1)}
    tr = defs[TRACKS_STREAM].config
    assert tr.subjects == ["fleet.prod.veh.*.track"] and tr.max_age == 90 * 86400
    assert tr.duplicate_window is not None and tr.duplicate_window >= 120  # a republished sample is dropped
    for size, n in (("small", 256 * 1024**2), ("medium", 5 * 1024**3)):
        sized = {d.name: d for d in load_definitions(DEFINITIONS_DIR, env="prod", replicas=1, size=size)}
        assert sized[TRACKS_STREAM].config.max_bytes == n


# -- on real peers -------------------------------------------------------------------

async def _command(gw: Gateway, command: int, *params: float) -> None:
    twin = gw.twins["VID-001"]
    p = list(params) + [0.0] * (7 - len(params))
    await twin.link.send(m.MAVLink_command_long_message(twin.link.target_system, 1, command, 0, *p))


async def _arm(gw: Gateway) -> bool:
    if not gw.twins["VID-001"].model.armed:
        await _command(gw, m.MAV_CMD_COMPONENT_ARM_DISARM, 1)
        await asyncio.sleep(0.5)
    return bool(gw.twins["VID-001"].model.armed)


async def _ready_to_arm(gw: Gateway, v: Any) -> None:
    twin = gw.twins["VID-001"]
    await wait_for(lambda: twin.model.fix_type == 3 and twin.model.home, 30)
    await asyncio.sleep(1.0)  # EKF settle (sim time, sped up)
    await _command(gw, m.MAV_CMD_DO_SET_MODE, 1, 4)  # GUIDED
    await wait_for(lambda: v.mode == "GUIDED", 10)


async def read_track(nc: Client, vid: str = "*") -> list[tuple[int, dict[str, Any], str]]:
    """Every stored sample: (time_ns, data, Nats-Msg-Id), in stream order."""
    js = nc.jetstream()
    subject = track_subject(ENV, vid)
    info = await js.stream_info(TRACKS_STREAM)
    out: list[tuple[int, dict[str, Any], str]] = []
    if not info.state.messages:
        return out
    sub = await js.subscribe(subject, ordered_consumer=True,
                             config=jsapi.ConsumerConfig(deliver_policy=jsapi.DeliverPolicy.ALL))
    try:
        for _ in range(info.state.messages):
            try:
                msg = await sub.next_msg(timeout=2.0)
            except Exception:
                break
            env = unpack(msg.data)
            out.append((env.time_ns, env.data, (msg.headers or {}).get("Nats-Msg-Id", "")))
            if msg.metadata.num_pending == 0:
                break
    finally:
        await sub.unsubscribe()
    return out


def _event_times(events: list[tuple[str, str, dict[str, Any], str]], etype: str) -> list[int]:
    # the event msg id is `<vid>:<type>:<time_ns>[:n]` (gateway/twin/telemetry.py)
    return [int(i.split(":")[2]) for _, t, _, i in events if t == etype]


async def test_samples_at_track_hz_only_while_armed_through_an_outage(
    provisioned: Client, nats_server: NatsServer, tmp_path: Path
) -> None:
    hz = 2.0
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=5.0)) as fleet:
        v = fleet.vehicles[0]
        cfg = gateway_config(nats_server.url, fleet.endpoints, tmp_path / "state", track_hz=hz)
        async with running(Gateway(cfg)) as gw:
            (rec,) = [s for s in gw.services if isinstance(s, TrackRecorder)]
            await _ready_to_arm(gw, v)
            assert rec.samples == 0  # disarmed: nothing recorded, though positions flow
            await wait_for_async(lambda: _arm(gw), timeout_s=20)
            await _command(gw, m.MAV_CMD_NAV_TAKEOFF, 0, 0, 0, 0, 0, 0, 10)
            await wait_for(lambda: v.alt_m > 8.0, 30)
            # NATS goes away for 3 s mid-flight: the gateway keeps sampling into its spool.
            nats_server.stop()
            await wait_for(lambda: not gw.publisher.is_connected, 10)
            during = rec.samples
            await asyncio.sleep(3.0)
            assert rec.samples > during and gw.twins["VID-001"].link.is_up
            nats_server.start()
            await wait_for(lambda: gw.publisher.is_connected, 30)
            # 3 s without NATS fences the owner (docs/ownership.md): it acts again once its lease is renewed.
            await wait_for(lambda: gw.ownership is not None and gw.ownership.keeper.may_act("VID-001"), 15)
            await _command(gw, m.MAV_CMD_NAV_LAND)
            await wait_for(lambda: not v.armed, 60)
            await wait_for(lambda: not gw.twins["VID-001"].model.armed, 10)
            taken = rec.samples
            await asyncio.sleep(1.5)  # disarmed again: no more samples
            assert rec.samples == taken
            await wait_for(lambda: rec.spool.depth == 0, 20)
        nc = await open_client(nats_server.url)
        try:
            track = await read_track(nc, "VID-001")
            events = await collect_events(nc)
            st = (await nc.jetstream().stream_info(TRACKS_STREAM)).state
        finally:
            await nc.close()
    (armed_ns,) = _event_times(events, "armed")
    (disarmed_ns,) = _event_times(events, "disarmed")
    times = [t for t, _, _ in track]
    assert len(track) == taken and times == sorted(times) and len(set(times)) == len(times)
    # the flight starts and ends on the track: a sample at each armed flip, none outside
    assert times[0] == armed_ns and times[-1] == disarmed_ns
    assert track[0][1]["armed"] is True and track[-1][1]["armed"] is False
    armed_s = (disarmed_ns - armed_ns) / 1e9
    expected = armed_s * hz
    # at most one per period (+ the two flips); at least most of them, on a loaded machine too
    assert 0.7 * expected <= len(track) <= expected + 3, (len(track), armed_s)
    gaps_s = [(b - a) / 1e9 for a, b in itertools.pairwise(times)]
    assert max(gaps_s) < 4 / hz, max(gaps_s)  # no hole where NATS was down (3 s)
    assert max(d["alt_m"] for _, d, _ in track) > 8.0
    for _, d, _ in track:
        assert math.isfinite(d["lat_deg"]) and math.isfinite(d["lon_deg"])
        assert {"alt_msl_m", "groundspeed_m_s", "battery_pct"} <= d.keys()
    assert all(i == track_msg_id("VID-001", t) for t, _, i in track)
    # the storage math in docs/analytics.md takes 340 bytes stored per sample (payload, subject, headers)
    assert st.messages == len(track) and st.bytes / st.messages <= 350, st.bytes / st.messages


async def test_track_hz_zero_records_nothing(provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=5.0)) as fleet:
        v = fleet.vehicles[0]
        cfg = gateway_config(nats_server.url, fleet.endpoints, tmp_path / "state", track_hz=0.0)
        async with running(Gateway(cfg)) as gw:
            assert not any(isinstance(s, TrackRecorder) for s in gw.services)
            await _ready_to_arm(gw, v)
            await wait_for_async(lambda: _arm(gw), timeout_s=20)
            await asyncio.sleep(2.0)
            await _command(gw, m.MAV_CMD_COMPONENT_ARM_DISARM, 0)
            await wait_for(lambda: not gw.twins["VID-001"].model.armed, 10)
            await wait_for(lambda: gw.spool.depth == 0, 10)
        assert not (tmp_path / "state" / TRACKS_SPOOL).exists()
    events = await collect_events(provisioned)
    types = [t for _, t, _, _ in events]
    assert "armed" in types and "disarmed" in types  # it was armed for 2 s
    info = await provisioned.jetstream().stream_info(TRACKS_STREAM)
    assert info.state.messages == 0


async def test_missing_stream_holds_back_no_event_and_samples_wait(nats_server: NatsServer, tmp_path: Path) -> None:
    nc = await open_client(nats_server.url)
    try:
        defs = load_definitions(DEFINITIONS_DIR, env=ENV, replicas=1)
        await provision(nc.jetstream(), [d for d in defs if d.name != TRACKS_STREAM])  # a server from before
        async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=5.0)) as fleet:
            v = fleet.vehicles[0]
            cfg: GatewayConfig = gateway_config(nats_server.url, fleet.endpoints, tmp_path / "state", track_hz=2.0)
            async with running(Gateway(cfg)) as gw:
                (rec,) = [s for s in gw.services if isinstance(s, TrackRecorder)]
                await _ready_to_arm(gw, v)
                await wait_for_async(lambda: _arm(gw), timeout_s=20)
                await asyncio.sleep(1.5)
                await _command(gw, m.MAV_CMD_COMPONENT_ARM_DISARM, 0)
                await wait_for(lambda: not gw.twins["VID-001"].model.armed, 10)
                # every event is out; the samples wait in their own spool
                await wait_for(lambda: gw.spool.depth == 0, 10)
                types = [t for _, t, _, _ in await collect_events(nc)]
                assert "armed" in types and "disarmed" in types
                await wait_for(lambda: rec.spool.depth == rec.samples, 5)  # spooled each tick
                assert rec.samples >= 3 and rec.published == 0
                await provision(nc.jetstream(), [d for d in defs if d.name == TRACKS_STREAM])
                await wait_for(lambda: rec.spool.depth == 0, 20)
                assert rec.published == rec.samples
        track = await read_track(nc, "VID-001")
        assert len(track) == rec.samples and [d["armed"] for _, d, _ in track][-1] is False
    finally:
        await nc.close()
