"""An in-process gateway for integration tests: a test config, running it, reading its events back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from nats.aio.client import Client
from nats.js import api as jsapi

from mavjet.contract.envelope import unpack
from mavjet.contract.natsconn import NatsOptions
from mavjet.drivers.mavlink.link import LinkConfig
from mavjet.drivers.mavlink.transport import Endpoint
from mavjet.gateway.config import GatewayConfig, VehicleConfig
from mavjet.gateway.daemon import Gateway

ENV = "test"


def gateway_config(url: str, endpoints: list[str], state_dir: Path, **kw: Any) -> GatewayConfig:
    """A gateway for VID-001..N on `endpoints`, with timeouts short enough for tests."""
    return GatewayConfig(
        vehicles=tuple(VehicleConfig(vid=f"VID-{i + 1:03d}", endpoint=Endpoint.parse(ep)) for i, ep in enumerate(endpoints)),
        nats=NatsOptions(servers=(url,), connect_timeout_s=1.0),
        env=ENV, instance="test-gw", state_dir=state_dir,
        link=kw.pop("link", LinkConfig(heartbeat_timeout_s=2.0, backoff_initial_s=0.1, backoff_max_s=0.5,
                                       stream_check_interval_s=0.5, stream_stale_s=2.0)),
        startup_timeout_s=10.0, nats_backoff_initial_s=0.2, nats_backoff_max_s=1.0,
        **kw,
    )


@asynccontextmanager
async def running(gw: Gateway) -> AsyncIterator[Gateway]:
    """Run `gw` in a task group until the block ends; yields once it is ready."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(gw.run)
        with anyio.fail_after(30):
            await gw.ready.wait()
        try:
            yield gw
        finally:
            gw.request_stop("test done")


@asynccontextmanager
async def running_gateway(cfg: GatewayConfig) -> AsyncIterator[Gateway]:
    async with running(Gateway(cfg)) as gw:
        yield gw


async def collect_events(nc: Client, subject: str = f"fleet.{ENV}.veh.*.evt.>") -> list[tuple[str, str, dict[str, Any], str]]:
    """Every stored event: (vid, type, data, msg_id)."""
    js = nc.jetstream()
    out: list[tuple[str, str, dict[str, Any], str]] = []
    try:
        info = await js.stream_info("TWIN_EVENTS", subjects_filter=subject)
    except Exception:
        return out
    total = info.state.messages
    if not total:
        return out
    sub = await js.subscribe(subject, ordered_consumer=True, config=jsapi.ConsumerConfig(deliver_policy=jsapi.DeliverPolicy.ALL))
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=1.0)
            except Exception:
                break
            env = unpack(msg.data)
            parts = msg.subject.split(".")
            out.append((parts[3], parts[5], env.data, (msg.headers or {}).get("Nats-Msg-Id", "")))
            if msg.metadata.num_pending == 0:
                break
    finally:
        await sub.unsubscribe()
    return out
