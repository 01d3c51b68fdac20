"""The flight recorder's track in the replay: a sim flight through the gateway, then the per-flight page.

A sim vehicle flies through the in-process gateway (track_hz = 2) to a real
nats-server; `mavjet replay`'s run must give its flight page every sample
TWIN_TRACKS holds, and a server without TWIN_TRACKS must fall back to the
events' own positions.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from mavjet.analytics import jobs
from mavjet.analytics.flightpages import collect_flights
from mavjet.analytics.flightreport import flight_file
from mavjet.analytics.options import parse_time_us
from mavjet.analytics.replay import ReplayConfig, run_replay
from mavjet.analytics.tracks import COLUMNS, TrackReader, has_samples, read_tracks, track_options
from mavjet.contract.natsconn import open_client
from mavjet.contract.subjects import TRACKS_STREAM
from mavjet.ops.natsserver import NatsServer
from mavjet.ops.provision import DEFINITIONS_DIR, load_definitions, provision
from tests.analytics.support import read


async def _fly(url: str, state_dir: Path) -> int:
    """Arm, climb to 10 m, land; returns how many samples the recorder took."""
    from mavjet.drivers.mavlink.dialect import mavlink2 as m
    from mavjet.gateway.daemon import Gateway
    from mavjet.gateway.stores.recorder import TrackRecorder
    from mavjet.sim.fleet import SimConfig, SimFleet
    from tests.support import gateway_config, running, wait_for, wait_for_async

    nc = await open_client(url)
    try:
        await provision(nc.jetstream(), load_definitions(DEFINITIONS_DIR, env="test", replicas=1))
    finally:
        await nc.close()
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=5.0)) as fleet:
        v = fleet.vehicles[0]
        async with running(Gateway(gateway_config(url, fleet.endpoints, state_dir, track_hz=2.0))) as gw:
            twin = gw.twins["VID-001"]
            (rec,) = [s for s in gw.services if isinstance(s, TrackRecorder)]

            async def command(cmd: int, *params: float) -> None:
                p = list(params) + [0.0] * (7 - len(params))
                await twin.link.send(m.MAVLink_command_long_message(twin.link.target_system, 1, cmd, 0, *p))

            async def arm() -> bool:
                if not twin.model.armed:
                    await command(m.MAV_CMD_COMPONENT_ARM_DISARM, 1)
                    await asyncio.sleep(0.5)
                return bool(twin.model.armed)

            await wait_for(lambda: twin.model.fix_type == 3 and twin.model.home, 30)
            await asyncio.sleep(1.0)
            await command(m.MAV_CMD_DO_SET_MODE, 1, 4)  # GUIDED
            await wait_for(lambda: v.mode == "GUIDED", 10)
            await wait_for_async(arm, timeout_s=20)
            await command(m.MAV_CMD_NAV_TAKEOFF, 0, 0, 0, 0, 0, 0, 10)
            await wait_for(lambda: v.alt_m > 8.0, 30)
            await asyncio.sleep(1.5)  # hover: a few samples at altitude
            await command(m.MAV_CMD_NAV_LAND)
            await wait_for(lambda: not v.armed, 60)
            await wait_for(lambda: not twin.model.armed, 10)
            await asyncio.sleep(0.8)  # the disarm sample reaches the spool on the next tick
            await wait_for(lambda: rec.spool.depth == 0 and gw.spool.depth == 0, 20)
            return rec.samples


def test_track_options_follow_the_events_read() -> None:
    ev = {"url": "nats://127.0.0.1:4222", "stream": "TWIN_EVENTS", "subjects": "fleet.prod.veh.*.evt.>",
          "data": "false", "start_time": "2026-01-01T00:00:00+00:00", "creds": "/x.creds", "partitions": "4"}
    # a few flights' vehicles and span: their subjects only, the span to the microsecond (ISO, not a float)
    narrow = track_options(ev, "prod", vids=("VID-001", "VID-007"), start_us=1_750_000_000_123_457,
                           end_us=1_750_000_060_000_001)
    assert narrow["subjects"] == "fleet.prod.veh.VID-001.track,fleet.prod.veh.VID-007.track"
    assert parse_time_us(narrow["start_time"], key="t") == 1_750_000_000_123_457
    assert parse_time_us(narrow["end_time"], key="t") == 1_750_000_060_000_001
    assert track_options(ev, "prod") == {
        "url": "nats://127.0.0.1:4222", "stream": TRACKS_STREAM, "subjects": "fleet.prod.veh.*.track",
        "data": "false", "start_time": "2026-01-01T00:00:00+00:00", "creds": "/x.creds", "partitions": "4"}


def test_replay_pages_get_the_recorded_track(spark: Any, nats_server: NatsServer, tmp_path: Path) -> None:
    recorded = asyncio.run(_fly(nats_server.url, tmp_path / "state"))
    assert recorded >= 5
    opts = track_options({"url": nats_server.url}, "test")
    track = read_tracks(spark, opts)
    assert track is not None and tuple(track.columns) == COLUMNS
    rows = track.orderBy("time").collect()
    assert len(rows) == recorded and {r["vid"] for r in rows} == {"VID-001"}
    assert all(r["lat_deg"] is not None and r["lon_deg"] is not None for r in rows)
    assert max(r["alt_m"] for r in rows) > 8.0 and rows[0]["alt_m"] < 1.0  # from the ground up

    # the data the page is drawn from: every recorded sample lands in the one flight
    events = read(spark, nats_server.url, subjects="fleet.test.veh.*.evt.>")
    flights = jobs.flights(events)
    (fd,) = collect_flights(events, flights, (), track)
    assert fd.flight["track_samples"] == recorded
    from_track = sorted(s["time"] for s in fd.samples if s["source"] == "track")
    assert from_track == [r["time"] for r in rows]
    assert fd.flight["start"] == rows[0]["time"] and fd.flight["end"] == rows[-1]["time"]
    # what the replay passes: a reader asked for the chosen flights' vehicles and span only
    (via_reader,) = collect_flights(events, flights, (), TrackReader(spark, {"url": nats_server.url}, "test"))
    assert sorted(s["time"] for s in via_reader.samples if s["source"] == "track") == from_track
    (without,) = collect_flights(events, flights)  # no recorder: the events' snapshots only
    assert without.flight["track_samples"] == 0 and len(without.samples) < len(fd.samples)

    # and end to end: `mavjet replay` writes the flight's page with the recorded positions
    out = tmp_path / "out"
    summary = run_replay(spark, ReplayConfig(out=str(out), url=nats_server.url, env="test", master="local[2]"))
    assert summary["flights"] == 1 and summary["flight_pages"] == 1
    page = (out / flight_file("VID-001", 1)).read_text(encoding="utf-8")
    # one count of positions on the page (the track's), split by where they came from
    n = sum(1 for s in via_reader.samples if s["lat_deg"] is not None and s["lon_deg"] is not None)
    assert n > recorded
    assert (f"<dd data-key=positions>{n:,} positions ({recorded:,} from the flight recorder, TWIN_TRACKS; "
            f"{n - recorded:,} from events)</dd>") in page
    assert f"<figcaption>track ({n:,} positions, north up, to scale)</figcaption>" in page


def test_no_stream_means_no_track(spark: Any, nats_server: NatsServer) -> None:
    opts = track_options({"url": nats_server.url}, "test")
    assert not has_samples(opts) and read_tracks(spark, opts) is None  # not provisioned: no TWIN_TRACKS

    async def empty_stream() -> None:
        nc = await open_client(nats_server.url)
        try:
            defs = load_definitions(DEFINITIONS_DIR, env="test", replicas=1)
            await provision(nc.jetstream(), [d for d in defs if d.name == TRACKS_STREAM])
        finally:
            await nc.close()

    asyncio.run(empty_stream())
    assert not has_samples(opts)  # provisioned, nothing recorded yet
