"""Edge hub: many vehicles on one UDP port, told apart by MAVLink system id."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
from nats.aio.client import Client

from mavjet.contract.errors import ConfigError
from mavjet.contract.natsconn import NatsOptions
from mavjet.drivers.mavlink.codec import MavCodec
from mavjet.drivers.mavlink.dialect import mavlink2 as m
from mavjet.drivers.mavlink.transport import Endpoint
from mavjet.drivers.mavlink.udphub import sysid_of
from mavjet.gateway.config import GatewayConfig, VehicleConfig, parse_vehicle
from mavjet.gateway.resolve import build_config
from mavjet.ops.natsserver import NatsServer, free_port
from mavjet.ops.read import current_state
from tests.support import ENV, running_gateway, wait_for, wait_for_async


class UdpVehicle:
    """A minimal autopilot over UDP: heartbeat + position, and it records what it receives."""

    def __init__(self, sysid: int, lat_deg: float, port: int) -> None:
        self.sysid = sysid
        self.lat_deg = lat_deg
        self.codec = MavCodec(src_system=sysid, src_component=1)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setblocking(False)
        self.dest = ("127.0.0.1", port)
        self.received: list[object] = []
        self.inbox = MavCodec()

    def step(self, t_ms: int) -> None:
        msgs = [
            m.MAVLink_heartbeat_message(m.MAV_TYPE_QUADROTOR, m.MAV_AUTOPILOT_ARDUPILOTMEGA,
                                        m.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED, 5, m.MAV_STATE_STANDBY, 3),
            m.MAVLink_global_position_int_message(t_ms, int(self.lat_deg * 1e7), int(8e7), 400_000, 0, 0, 0, 0, 0),
        ]
        self.sock.sendto(self.codec.encode_many(msgs), self.dest)
        while True:
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                break
            self.received += self.inbox.feed(data)


def test_sysid_of_reads_the_header() -> None:
    v2 = MavCodec(src_system=42, src_component=1).encode(m.MAVLink_heartbeat_message(2, 3, 0, 0, 4, 3))
    assert sysid_of(v2) == 42
    assert sysid_of(b"\x00garbage") is None and sysid_of(b"") is None


def test_sharing_needs_udp_and_distinct_sysids() -> None:
    base = [{"vid": "A", "endpoint": "udp:0.0.0.0:14550", "sysid": 1}, {"vid": "B", "endpoint": "udp:0.0.0.0:14550"}]
    with pytest.raises(ConfigError, match="distinct sysids"):
        build_config({"vehicles": base})
    base[1]["sysid"] = 2
    assert [v.sysid for v in build_config({"vehicles": base}).vehicles] == [1, 2]
    with pytest.raises(ConfigError, match="only a udp"):
        build_config({"vehicles": [{"vid": "A", "endpoint": "tcp:h:1"}, {"vid": "B", "endpoint": "tcp:h:1"}]})
    assert parse_vehicle("VID-007=udp:0.0.0.0:14550?sysid=7").sysid == 7
    with pytest.raises(ConfigError):
        parse_vehicle("VID-007=udp:0.0.0.0:14550?colour=7")


async def test_two_vehicles_on_one_port(provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    port = free_port()
    ep = Endpoint.parse(f"udp:127.0.0.1:{port}")
    cfg = GatewayConfig(
        vehicles=(VehicleConfig(vid="VID-001", endpoint=ep, sysid=1), VehicleConfig(vid="VID-002", endpoint=ep, sysid=2)),
        nats=NatsOptions(servers=(nats_server.url,)), env=ENV, state_dir=tmp_path / "state", startup_timeout_s=10,
    )
    a, b = UdpVehicle(1, 47.0, port), UdpVehicle(2, 48.0, port)
    stray = UdpVehicle(9, 49.0, port)  # not configured: counted, ignored
    stop = asyncio.Event()

    async def fly() -> None:
        t = 0
        while not stop.is_set() and t < 30_000:
            for v in (a, b, stray):
                v.step(t)
            t += 100
            await asyncio.sleep(0.1)

    task = asyncio.create_task(fly())
    try:
        async with running_gateway(cfg) as gw:
            t1, t2 = gw.twins["VID-001"], gw.twins["VID-002"]
            await wait_for(lambda: t1.link.is_up and t2.link.is_up, 15)
            await wait_for(lambda: t1.model.lat_deg is not None and t2.model.lat_deg is not None, 10)
            assert round(t1.model.lat_deg, 3) == 47.0 and round(t2.model.lat_deg, 3) == 48.0
            hub = gw.hubs[str(ep)]
            await wait_for(lambda: hub.stats.unknown_sysid > 0, 5)
            # A command for VID-002 reaches vehicle 2's socket only.
            await t2.link.send(m.MAVLink_command_long_message(2, 1, m.MAV_CMD_NAV_LAND, 0, 0, 0, 0, 0, 0, 0, 0))

            def landed_cmd(v: UdpVehicle) -> bool:
                return any(x._type == "COMMAND_LONG" and x.command == m.MAV_CMD_NAV_LAND for x in v.received)

            await wait_for(lambda: landed_cmd(b), 5)
            await asyncio.sleep(0.3)
            assert not landed_cmd(a)
            # Both twins publish their own state.
            js = provisioned.jetstream()

            async def both() -> bool:
                st = await current_state(js, ENV)
                return ("VID-001", "position") in st and ("VID-002", "position") in st

            await wait_for_async(both, 15)
            st = await current_state(js, ENV)
            assert round(st[("VID-002", "position")].data["lat_deg"], 3) == 48.0
    finally:
        stop.set()
        await task
        for v in (a, b, stray):
            v.sock.close()
