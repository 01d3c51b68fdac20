"""`mavjet synth` also writes the flight recorder's track: one sample per 1/track_hz s of every synthetic flight.

The samples are built the way gateway/stores/recorder.py builds a real vehicle's
(`mavjet.contract.tracks`), on its subject, and read back here with
analytics/tracks.py's reader from a real nats-server. Tolerance of the count:
a flight of D seconds at R Hz has floor(D x R) + 1 periodic samples plus the
one at the disarm, so |count - D x R| <= 2.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client

from mavjet.analytics.synth import (
    AuditConfig,
    SynthEvent,
    Truth,
    generate,
    generate_days,
    publish,
    publish_history,
)
from mavjet.analytics.synthtrack import FlightPath, period_ns
from mavjet.analytics.tracks import COLUMNS, read_tracks, track_options
from mavjet.contract.envelope import unpack
from mavjet.contract.subjects import EVENTS_STREAM, TRACKS_STREAM, track_subject
from mavjet.contract.tracks import track_msg_id
from mavjet.ops.natsserver import NatsServer
from tests.analytics.support import read

END_NS = 1_795_000_000 * 10**9
COUNT_TOLERANCE = 2


def _cfg(**kw: Any) -> AuditConfig:
    base: dict[str, Any] = {"vehicles": 3, "days": 1, "seed": 11, "env": "test", "end_ns": END_NS,
                            "link_loss_prob": 0.0, "flights_per_day": 2.0}
    return AuditConfig(**{**base, **kw})


def _paths(cfg: AuditConfig) -> list[FlightPath]:
    return [p for _, paths in generate_days(cfg, Truth()) for p in paths]


def _flight_events(cfg: AuditConfig, vid: str, start_ns: int, end_ns: int) -> list[SynthEvent]:
    return [e for day in generate(cfg, Truth()) for e in day if e.vid == vid and start_ns <= e.time_ns <= end_ns]


def _area(events: list[SynthEvent]) -> tuple[float, float, float, float]:
    lats = [e.data["lat_deg"] for e in events]
    lons = [e.data["lon_deg"] for e in events]
    eps = 1e-6  # the events' snapshots are rounded to 7 decimals
    return min(lats) - eps, max(lats) + eps, min(lons) - eps, max(lons) + eps


def test_every_flight_is_sampled_at_the_rate_within_its_area() -> None:
    cfg = _cfg()
    truth = Truth(keep_detail=True)
    days = list(generate_days(cfg, truth))
    paths = [p for _, ps in days for p in ps]
    assert len(paths) == len(truth.flights) >= 3
    for hz in (1.0, 2.0):
        for path, flight in zip(paths, truth.flights, strict=True):
            assert (path.vid, path.start_ns, path.end_ns) == (flight.vid, flight.start_ns, flight.end_ns)
            samples = list(path.samples(period_ns(hz)))
            duration_s = (flight.end_ns - flight.start_ns) / 1e9
            assert abs(len(samples) - duration_s * hz) <= COUNT_TOLERANCE, (len(samples), duration_s)
            times = [t for t, _ in samples]
            assert times == sorted(set(times)) and times[0] == flight.start_ns and times[-1] == flight.end_ns
            lat_lo, lat_hi, lon_lo, lon_hi = _area(_flight_events(cfg, path.vid, flight.start_ns, flight.end_ns))
            for _, d in samples:
                assert lat_lo <= d["lat_deg"] <= lat_hi and lon_lo <= d["lon_deg"] <= lon_hi
                assert 0 <= d["alt_m"] <= flight.max_alt_m and d["alt_msl_m"] == pytest.approx(d["alt_m"] + 488, abs=0.02)
                assert 0 <= d["battery_pct"] <= 100
            # up and down again; armed until the disarm sample, like the recorder's
            assert samples[0][1]["alt_m"] == 0 and samples[-1][1]["alt_m"] == 0
            assert max(d["alt_m"] for _, d in samples) >= flight.max_alt_m - 15.0
            assert [d["armed"] for _, d in samples] == [True] * (len(samples) - 1) + [False]
            assert samples[0][1]["battery_pct"] - samples[-1][1]["battery_pct"] == pytest.approx(
                flight.battery_used_pct, abs=1.01)  # two samples rounded to whole percent


def test_no_samples_while_the_link_is_lost() -> None:
    paths = [p for p in _paths(_cfg(link_loss_prob=1.0, failsafe_prob=0.0)) if p.outages()]
    assert paths
    for p in paths:
        (lo, hi), = p.outages()
        times = list(p.sample_times(period_ns(1.0)))
        assert not [t for t in times if lo < t < hi]
        expected_s = (p.end_ns - p.start_ns - (hi - lo)) / 1e9
        assert abs(len(times) - expected_s) <= COUNT_TOLERANCE + 1  # one more edge at the gap


def test_tracks_leave_the_events_and_the_truth_as_they_were() -> None:
    cfg = _cfg(vehicles=4, days=2)
    plain, with_paths = Truth(keep_detail=True), Truth(keep_detail=True)
    events = [e for day in generate(cfg, plain) for e in day]
    assert [e for day, _ in generate_days(cfg, with_paths) for e in day] == events
    assert plain.summary() == with_paths.summary()


async def test_synth_tracks_read_back_with_the_tracks_reader(
    provisioned: Client, nats_server: NatsServer, spark: Any
) -> None:
    cfg = _cfg()
    truth = Truth(keep_detail=True)
    out = await publish_history(provisioned.jetstream(), cfg, truth, track_hz=1.0)
    assert out.events == truth.events and out.track_samples > 0

    def read_back() -> tuple[tuple[str, ...], list[Any], list[Any]]:
        """Off the event loop: the reader runs its own (mavjet.analytics.natsread)."""
        track = read_tracks(spark, track_options({"url": nats_server.url}, "test"))
        assert track is not None
        stored = read(spark, nats_server.url, stream=TRACKS_STREAM, subjects=track_subject("test", "*"))
        return tuple(track.columns), track.collect(), stored.select("vid", "seq", "time").collect()

    columns, rows, stored = await asyncio.to_thread(read_back)
    assert columns == COLUMNS
    assert len(rows) == out.track_samples
    by_vid: dict[str, list[Any]] = defaultdict(list)
    for r in rows:
        by_vid[r["vid"]].append(r)
    assert set(by_vid) == {f.vid for f in truth.flights}
    for flight in truth.flights:
        start_us, end_us = flight.start_ns // 1000, flight.end_ns // 1000
        mine = [r for r in by_vid[flight.vid] if start_us <= _us(r["time"]) <= end_us]
        duration_s = (flight.end_ns - flight.start_ns) / 1e9
        assert abs(len(mine) - duration_s) <= COUNT_TOLERANCE, (flight.vid, len(mine), duration_s)
        lat_lo, lat_hi, lon_lo, lon_hi = _area(_flight_events(cfg, flight.vid, flight.start_ns, flight.end_ns))
        assert all(lat_lo <= r["lat_deg"] <= lat_hi and lon_lo <= r["lon_deg"] <= lon_hi for r in mine)
        assert all(0 <= r["alt_m"] <= flight.max_alt_m for r in mine)
    # every sample belongs to a flight
    assert sum(len(v) for v in by_vid.values()) == sum(
        1 for r in rows for f in truth.flights
        if f.vid == r["vid"] and f.start_ns // 1000 <= _us(r["time"]) <= f.end_ns // 1000)

    # stored in time order per vehicle: the stream's sequence order is the samples' time order
    per_vid: dict[str, list[tuple[int, Any]]] = defaultdict(list)
    for r in stored:
        per_vid[r["vid"]].append((r["seq"], r["time"]))
    for vid, seq_time in per_vid.items():
        times = [t for _, t in sorted(seq_time)]
        assert times == sorted(times) and len(set(times)) == len(times), vid

    # the same publish again is de-duplicated by Nats-Msg-Id (the recorder's ids)
    again = await publish_history(provisioned.jetstream(), cfg, Truth(), track_hz=1.0)
    assert again.track_samples == out.track_samples
    info = await provisioned.jetstream().stream_info(TRACKS_STREAM)
    assert info.state.messages == out.track_samples


def _us(t: Any) -> int:
    """A collected timestamp as exact epoch µs (pyspark hands back naive local times)."""
    assert isinstance(t, dt.datetime)
    aware = t if t.tzinfo else t.astimezone(dt.UTC)
    return (aware - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)


async def test_max_events_cuts_the_tracks_at_the_last_published_event(provisioned: Client) -> None:
    cfg = _cfg(vehicles=2)
    full = [e for day in generate(cfg, Truth()) for e in day]
    limit = len(full) // 2
    truth = Truth(keep_detail=True)
    out = await publish_history(provisioned.jetstream(), cfg, truth, max_events=limit, track_hz=2.0)
    assert out.events == limit
    plain_truth = Truth(keep_detail=True)
    cut_ns = full[limit - 1].time_ns
    paths = _paths(cfg)
    every = period_ns(2.0)
    expected = sum(1 for p in paths for t, _ in p.samples(every) if t <= cut_ns)
    assert 0 < out.track_samples == expected < sum(1 for p in paths for _ in p.samples(every))

    js = provisioned.jetstream()
    assert (await js.stream_info(TRACKS_STREAM)).state.messages == expected
    assert (await js.stream_info(EVENTS_STREAM)).state.messages == limit
    sub = await js.subscribe(track_subject("test", "*"), ordered_consumer=True)
    try:
        for _ in range(expected):
            msg = await sub.next_msg(timeout=5)
            env = unpack(msg.data)
            assert env.time_ns <= cut_ns
            assert msg.headers is not None and msg.headers["Nats-Msg-Id"] == track_msg_id(env.vid, env.time_ns)
    finally:
        await sub.unsubscribe()
    # the truth the event checks use is the same as a publish without tracks
    await publish(js, cfg, plain_truth, max_events=limit)
    assert plain_truth.summary() == truth.summary()


def test_synth_command_writes_tracks_and_refuses_a_bad_rate(nats_server: NatsServer, tmp_path: Path) -> None:
    base = [sys.executable, "-m", "mavjet.ops", "synth", "--vehicles", "2", "--days", "1", "--seed", "5",
            "--end", "2026-11-01T00:00:00Z", "--nats", nats_server.url, "--env", "test"]
    summary_file = tmp_path / "truth.json"
    out = subprocess.run([*base, "--track-hz", "0.5", "--json", str(summary_file)], capture_output=True, text=True,
                         timeout=90, check=False)
    assert out.returncode == 0, out.stderr
    summary = json.loads(summary_file.read_text())
    assert summary["track_hz"] == 0.5 and summary["track_samples"] > 0
    assert summary["published"] == summary["events"]

    async def stored() -> int:
        from mavjet.contract.natsconn import open_client

        nc = await open_client(nats_server.url)
        try:
            return int((await nc.jetstream().stream_info(TRACKS_STREAM)).state.messages)
        finally:
            await nc.close()

    assert asyncio.run(stored()) == summary["track_samples"]
    bad = subprocess.run([*base, "--track-hz", "-1"], capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "track_hz" in bad.stderr
