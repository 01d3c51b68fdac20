"""ops/resolve.py and the smaller CLI fixes of issue 49, against a real nats-server where they talk to one."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import time
from typing import Any

import pytest
from nats.aio.client import Client
from nats.js import api as jsapi

from mavjet.analytics.replay import missing_requirement
from mavjet.contract.envelope import CONTENT_TYPE, pack
from mavjet.contract.errors import MavjetError
from mavjet.contract.natsconn import NatsUnavailable, add_nats_arguments
from mavjet.contract.subjects import (
    EVENTS_STREAM,
    SHADOW_BUCKET,
    STATE_STREAM,
    event_filter,
    shadow_key,
    state_subject,
)
from mavjet.ops import resolve
from mavjet.ops.fleet import FleetView
from mavjet.ops.fmt import format_value
from mavjet.ops.natsserver import free_port
from mavjet.ops.read import STALE_AFTER_S, Record, caught_up
from mavjet.ops.runner import nats_servers
from mavjet.ops.synth import AckCounter

ENV = "test"
NOW = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.UTC)


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_nats_arguments(p)
    return p.parse_args(list(argv))


def test_nats_takes_host_port_like_the_nats_cli_and_names_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MAVJET_NATS", raising=False)
    args = _args("--nats", "127.0.0.1:14222, tls://hub:4443")
    nats_servers(args, ["--nats", "127.0.0.1:14222, tls://hub:4443"])
    assert args.nats == "nats://127.0.0.1:14222,tls://hub:4443"
    with pytest.raises(MavjetError, match=r"^--nats: .*port") as bad:
        nats_servers(_args("--nats", "hub:port"), ["--nats", "hub:port"])
    assert "config" not in str(bad.value)
    monkeypatch.setenv("MAVJET_NATS", "http://hub:4222")
    with pytest.raises(MavjetError, match=r"^\$MAVJET_NATS: .*scheme"):
        nats_servers(_args(), [])


async def test_a_refused_connection_fails_at_once() -> None:
    port = free_port()  # nothing listens there
    t0 = time.monotonic()
    with pytest.raises(NatsUnavailable, match="connection refused"):
        await resolve.connect(_args("--nats", f"nats://127.0.0.1:{port}"), name="test")
    assert time.monotonic() - t0 < 1.5  # the connect deadline (5 s) is not waited out


def _record(vid: str, kind: str, age_s: float, **data: Any) -> Record:
    return Record(f"fleet.t.veh.{vid}.state.{kind}", vid, kind, 1, NOW - dt.timedelta(seconds=age_s), data)


def test_fleet_columns_fit_the_terminal_and_keep_whole_positions() -> None:
    view = FleetView()
    for kind, data in (("status", {"mode": "GUIDED", "armed": True}), ("link", {"state": "up", "period_s": 1.0}),
                       ("position", {"lat_deg": -35.3632621, "lon_deg": 149.1652374, "alt_m": 12.0})):
        view.on_state(_record("VID-001", kind, 0.2, **data))
    wide = view.render(NOW, "t\nexport MAVJET_NATS=nats://x:4222", width=200, height=50).splitlines()
    assert wide[1].startswith("export MAVJET_NATS=") and "POSITION" in wide[2]
    assert "-35.36326,149.16524" in wide[3]  # not cut at 200 columns
    narrow = view.render(NOW, "t", width=60, height=24).splitlines()
    assert "POSITION" not in narrow[1] and max(len(line) for line in narrow) <= 60


def test_home_positions_at_full_precision() -> None:
    assert format_value("home_lat_deg", -35.3632621) == "-35.3632621"
    assert format_value("home_lon_deg", 149.1652374) == "149.1652374"
    assert format_value("heading_deg", 12.34) == "12.3"


async def test_env_and_vehicle_resolution(provisioned: Client) -> None:
    js = provisioned.jetstream()
    with pytest.raises(resolve.NotProvisioned, match="mavjet provision --env staging"):
        await resolve.require_env(js, "staging", (EVENTS_STREAM,))
    await resolve.require_env(js, ENV, (EVENTS_STREAM, STATE_STREAM, SHADOW_BUCKET))
    with pytest.raises(resolve.UnknownVehicle, match="--force to queue it"):
        await resolve.vehicle(provisioned, ENV, "VID-404", force="queue it")
    unknown = await resolve.vehicle(provisioned, ENV, "VID-404", allow_unknown=True)
    assert not unknown.known and not unknown.gone
    # a shadow document is enough to be known
    kv = await js.key_value(SHADOW_BUCKET)
    await kv.put(shadow_key(ENV, "VID-005", "desired"), b'{"mode": "GUIDED"}')
    assert (await resolve.vehicle(provisioned, ENV, "VID-005")).known
    # a gateway whose liveness record stopped: gone, with its age
    old = int((dt.datetime.now(dt.UTC) - dt.timedelta(seconds=40)).timestamp() * 1e9)
    for channel, data in (("link", {"state": "up", "period_s": 1.0}), ("status", {"mode": "AUTO", "armed": False})):
        await js.publish(state_subject(ENV, "VID-006", channel), pack("VID-006", old, data),
                         headers={"Content-Type": CONTENT_TYPE})
    gone = await resolve.vehicle(provisioned, ENV, "VID-006")
    assert gone.known and gone.gone and "is gone" in gone.gone_text()
    with pytest.raises(resolve.VehicleGone, match="nobody would answer"):
        resolve.require_served(gone, why="nobody would answer")
    # old samples and no liveness record at all: nothing serves it either
    await js.publish(state_subject(ENV, "VID-007", "status"), pack("VID-007", old, {"mode": "AUTO"}),
                     headers={"Content-Type": CONTENT_TYPE})
    unserved = await resolve.vehicle(provisioned, ENV, "VID-007")
    assert unserved.gone and "no liveness record" in unserved.gone_text()
    assert resolve.STALE_AFTER_S == STALE_AFTER_S


async def test_an_empty_read_ends_when_the_stream_says_so(provisioned: Client) -> None:
    """No fixed wait: a consumer with nothing in range ends the read at once, not at its bound."""
    js = provisioned.jetstream()
    done = asyncio.Event()

    async def cb(_msg: Any) -> None:
        done.set()

    cfg = jsapi.ConsumerConfig(deliver_policy=jsapi.DeliverPolicy.BY_START_TIME,
                               opt_start_time=dt.datetime.now(dt.UTC).isoformat())
    sub = await js.subscribe(event_filter(ENV, "VID-404"), cb=cb, ordered_consumer=True, config=cfg)
    t0 = time.monotonic()
    try:
        await caught_up(sub, done, timeout_s=30.0)
    finally:
        await sub.unsubscribe()
    assert time.monotonic() - t0 < 2.0 and not done.is_set()


async def test_synth_counts_only_acknowledged_publishes(provisioned: Client) -> None:
    errors: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: errors.append(ctx))
    js = AckCounter(provisioned.jetstream(publish_async_max_pending=100))
    now = int(time.time() * 1e9)
    for i in range(3):
        await js.publish_async(f"fleet.{ENV}.veh.VID-001.evt.statustext", pack("VID-001", now, {"i": i}),
                               headers={"Nats-Msg-Id": f"synth-test-{i}"})
    await js.publish_async("nowhere.stored", b"x")  # no stream: never acked
    await asyncio.wait_for(js.publish_async_completed(), 10)
    await asyncio.sleep(0)
    assert js.acked == {"events": 3, "tracks": 0} and js.failed == 1 and js.first_error is not None
    assert not errors  # the failed future's exception was read: no "Future exception was never retrieved"


def test_replay_names_what_it_lacks(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    line = missing_requirement()
    assert line is not None and "JAVA_HOME" in line and "Java 17" in line and "\n" not in line


def test_provision_hint_is_one_line() -> None:
    text = str(resolve.NotProvisioned("staging", EVENTS_STREAM))
    assert "\n" not in text and "mavjet provision --env staging" in text


def test_replay_takes_host_port_and_a_refused_server_ends_it_at_once() -> None:
    import subprocess
    import sys
    import time

    from mavjet.ops.natsserver import free_port

    started = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "mavjet.ops", "replay", "--nats", f"127.0.0.1:{free_port()}",
                        "--since", "1h", "--out", "/nonexistent/never-written"],
                       capture_output=True, text=True, timeout=60, check=False)
    took_s = time.monotonic() - started
    assert r.returncode == 2 and "connection refused" in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()  # its progress line ("checking TWIN_EVENTS ..."), then the one error
    assert "connection refused" in lines[-1] and len(lines) <= 2 and "Traceback" not in r.stderr, lines
    assert took_s < 5.0, took_s  # a refusal is the answer: no 5 s connect deadline
