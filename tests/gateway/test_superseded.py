"""`mavjet_state_superseded_total`: the state samples a newer one replaced before their publish turn."""

from __future__ import annotations

from pathlib import Path

import anyio
from nats.aio.client import Client
from nats.aio.msg import Msg
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.gateway.config import DEFAULT_RATES_HZ
from mavjet.gateway.daemon import Gateway
from mavjet.ops.natsserver import NatsServer
from mavjet.sim.fleet import SimConfig, SimFleet
from tests.support.gateway import ENV, gateway_config, running

ATTITUDE_HZ = 2.0  # the vehicle sends ATTITUDE at 10 Hz (the link's default stream rate)


def superseded_metric(gw: Gateway) -> float:
    text = generate_latest(gw.metrics.registry).decode()
    (fam,) = [f for f in text_string_to_metric_families(text) if f.name == "mavjet_state_superseded"]
    (sample,) = fam.samples
    return float(sample.value)


async def test_samples_decimated_by_the_configured_rate_are_counted_as_superseded(
    provisioned: Client, nats_server: NatsServer, tmp_path: Path
) -> None:
    published: dict[str, int] = {}

    async def on_msg(msg: Msg) -> None:
        channel = msg.subject.rsplit(".", 1)[1]
        published[channel] = published.get(channel, 0) + 1

    rates = dict(DEFAULT_RATES_HZ, attitude=ATTITUDE_HZ)
    sub = await provisioned.subscribe(f"fleet.{ENV}.veh.VID-001.state.>", cb=on_msg)
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=1.0)) as fleet:
        gw = Gateway(gateway_config(nats_server.url, fleet.endpoints, tmp_path, rates_hz=rates))
        async with running(gw):
            twin = gw.twins["VID-001"]
            with anyio.fail_after(20):
                while published.get("attitude", 0) < 6:
                    await anyio.sleep(0.1)
            value = superseded_metric(gw)
            # The metric is the fleet's sum, read at scrape time.
            assert value == twin.superseded
            made, taken, pending = twin.model.samples, twin.samples_taken, len(twin.fresh)
    await sub.unsubscribe()
    assert made + twin.link.codec.stats.superseded == taken + pending + value
    # ~10 attitude samples a second made, 2 published: ~4 superseded for each one published.
    # Position (10 Hz in, 10 Hz out) adds few.
    assert value >= 2 * published["attitude"], (value, published)
    assert value <= made - published["attitude"], (value, made, published)


async def test_a_backlogged_read_skips_older_positions_only_while_disarmed(
    provisioned: Client, nats_server: NatsServer, tmp_path: Path
) -> None:
    """Positions feed the flight's distance and highest altitude while armed: then every one is decoded."""
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=1.0)) as fleet:
        gw = Gateway(gateway_config(nats_server.url, fleet.endpoints, tmp_path))
        async with running(gw):
            twin = gw.twins["VID-001"]
            codec = twin.link.codec
            assert twin.model.armed is False
            assert codec.newest_only == {mavlink2.MAVLINK_MSG_ID_ATTITUDE, mavlink2.MAVLINK_MSG_ID_GLOBAL_POSITION_INT}
            twin.model.armed = True  # as the next HEARTBEAT with the armed flag sets it
            twin.on_messages([], 0)
            assert codec.newest_only == {mavlink2.MAVLINK_MSG_ID_ATTITUDE}
            twin.model.armed = False
            twin.on_messages([], 0)
            assert mavlink2.MAVLINK_MSG_ID_GLOBAL_POSITION_INT in codec.newest_only


async def test_an_unpackable_sample_is_lost_alone(provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    """Samples are packed as they arrive: one that cannot be packed costs that sample and an error, nothing more."""
    published: dict[str, int] = {}

    async def on_msg(msg: Msg) -> None:
        channel = msg.subject.rsplit(".", 1)[1]
        published[channel] = published.get(channel, 0) + 1

    sub = await provisioned.subscribe(f"fleet.{ENV}.veh.VID-001.state.>", cb=on_msg)
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=1.0)) as fleet:
        gw = Gateway(gateway_config(nats_server.url, fleet.endpoints, tmp_path))
        async with running(gw):
            twin = gw.twins["VID-001"]
            errors = gw.metrics.errors.labels(where="telemetry")
            before = errors._value.get()
            now_ns = twin.clock.now_ns()
            twin.model._set("battery", now_ns, {"voltage_v": object()})
            twin.model._set("gps", now_ns, {"fix_type": 3})
            twin.on_messages([], now_ns)
            assert errors._value.get() == before + 1
            # Waiting in the twin, or queued for the next tick (ReadyStates) when due on arrival.
            waiting = {c.subject for c in twin.fresh} | {subject for subject, _, _ in twin.ready.items}
            channels = {subject.rsplit(".", 1)[1] for subject in waiting if ".VID-001." in subject}
            assert "gps" in channels and "battery" not in channels, channels
            seen = dict(published)
            with anyio.fail_after(10):  # the other channels go on, and the next SYS_STATUS mends the battery
                while published.get("position", 0) < seen.get("position", 0) + 5 or \
                        published.get("battery", 0) <= seen.get("battery", 0):
                    await anyio.sleep(0.05)
    await sub.unsubscribe()
