"""The NATS tunnel: a ground station on the operator's laptop reaches a sim vehicle through core NATS.

A pymavlink ground station (tests/gateway/test_routes.py's `Gcs`) checks
heartbeats, parameters and a mode change, and measures the added latency of a
PARAM_REQUEST_READ round trip through the tunnel against a direct route of
the same gateway (`pytest -s -k latency` prints p50/p99).
"""

from __future__ import annotations

import statistics
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import anyio
import pytest
from nats.aio.client import Client

from mavjet.contract import natsconn
from mavjet.contract.natsconn import NatsOptions
from mavjet.drivers.mavlink.dialect import mavlink2 as m
from mavjet.drivers.mavlink.transport import Endpoint
from mavjet.gateway.config import parse_route
from mavjet.gateway.daemon import Gateway
from mavjet.ops.natsserver import NatsServer
from mavjet.ops.tunnel import Tunnel
from mavjet.sim.fleet import SimConfig, SimFleet
from tests.gateway.test_routes import GUIDED, Gcs, _free_udp_port, _hb, set_mode_guided
from tests.support import ENV, gateway_config, running


@pytest.fixture
async def sim1() -> AsyncIterator[SimFleet]:
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=4.0)) as fleet:
        yield fleet


async def _round_trips(gcs: Gcs, n: int) -> list[float]:
    out: list[float] = []
    await anyio.sleep(0.5)
    gcs.drain()  # replies to the other ground station's requests reached this one too
    for i in range(n):
        idx = i % 10
        t0 = anyio.current_time()
        await gcs.send(m.MAVLink_param_request_read_message(1, 1, b"", idx))
        await gcs.recv(lambda x, k=idx: x.get_type() == "PARAM_VALUE" and x.param_index == k, timeout_s=5)
        out.append((anyio.current_time() - t0) * 1000)
    return out


def _p(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


async def test_tunnel_params_mode_and_latency(provisioned: Client, nats_server: NatsServer, sim1: SimFleet,
                                              tmp_path: Path) -> None:
    direct = Gcs(sysid=250)
    cfg = gateway_config(nats_server.url, sim1.endpoints, tmp_path / "state")
    cfg = replace(cfg, tunnel=True, routes=(parse_route(f"udpout:127.0.0.1:{direct.port}"),))
    listen = _free_udp_port()
    laptop = Gcs(peer=("127.0.0.1", listen))
    nc = await natsconn.connect_once(NatsOptions(servers=(nats_server.url,), name="laptop"))
    try:
        async with running(Gateway(cfg)), anyio.create_task_group() as tg:
            tunnel = Tunnel(nc, ENV, "VID-001")
            await tg.start(tunnel.run, Endpoint.parse(f"udp:127.0.0.1:{listen}"))
            await laptop.send(m.MAVLink_heartbeat_message(6, 8, 0, 0, 4, 3))  # the tunnel learns its peer
            await laptop.recv(_hb)
            await laptop.send(m.MAVLink_param_request_read_message(1, 1, b"MAV_SYSID", -1))
            pv = await laptop.recv(lambda x: x.get_type() == "PARAM_VALUE" and x.param_id == "MAV_SYSID")
            assert pv.param_value == 1
            await set_mode_guided(laptop)
            await laptop.recv(lambda x: _hb(x) and x.custom_mode == GUIDED)
            # Added latency: the same request through the tunnel and through a direct route.
            await direct.recv(_hb)
            n = 500
            via_direct = await _round_trips(direct, n)
            up_before = tunnel.frames_up
            via_tunnel = await _round_trips(laptop, n)
            print(f"\nPARAM_REQUEST_READ round trip, ms (n={n}): direct p50 {_p(via_direct, .5):.2f} "
                  f"p99 {_p(via_direct, .99):.2f}; tunnel p50 {_p(via_tunnel, .5):.2f} p99 {_p(via_tunnel, .99):.2f}; "
                  f"added p50 {_p(via_tunnel, .5) - _p(via_direct, .5):.2f}")
            assert statistics.median(via_tunnel) < 50
            assert tunnel.frames_down > 10 and tunnel.frames_up >= up_before + n
            tg.cancel_scope.cancel()
    finally:
        direct.close()
        laptop.close()
        await nc.close()
