"""Ground stations through the gateway (`--route`): real sockets, a sim vehicle, a pymavlink ground station.

The ground station here is pymavlink's own framing and parsing on an asyncio
UDP socket (the MAVProxy runs are in tests/ops/test_tunnel_mavproxy.py).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest
from nats.aio.client import Client

from mavjet.drivers.mavlink.dialect import mavlink2 as m
from mavjet.drivers.mavlink.router import RouteFilter
from mavjet.gateway.config import GatewayConfig, parse_route
from mavjet.gateway.daemon import Gateway
from mavjet.gateway.routes import RouteHub
from mavjet.ops.natsserver import NatsServer
from mavjet.ops.read import current_state
from mavjet.sim.fleet import SimConfig, SimFleet
from tests.support import ENV, gateway_config, running, wait_for_async

GUIDED = 4


class Gcs:
    """A ground station (sysid 255) on a UDP socket: pymavlink frames what it sends and parses what it gets."""

    def __init__(self, *, sysid: int = 255, compid: int = 190, peer: tuple[str, int] | None = None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self.peer = peer
        self.mav = m.MAVLink(None, srcSystem=sysid, srcComponent=compid)
        self.parser = m.MAVLink(None)
        self.parser.robust_parsing = True
        self.received: list[Any] = []
        self.raw: list[bytes] = []

    async def send(self, msg: Any) -> None:
        assert self.peer is not None
        await asyncio.get_running_loop().sock_sendto(self.sock, msg.pack(self.mav), self.peer)

    async def recv(self, pred: Callable[[Any], bool], timeout_s: float = 10.0) -> Any:
        loop = asyncio.get_running_loop()
        with anyio.fail_after(timeout_s):
            while True:
                data, addr = await loop.sock_recvfrom(self.sock, 65536)
                if self.peer is None:
                    self.peer = addr
                self.raw.append(data)
                for msg in self.parser.parse_buffer(data) or []:
                    self.received.append(msg)
                    if pred(msg):
                        return msg

    def drain(self) -> None:
        """Drop every datagram already queued."""
        while True:
            try:
                self.sock.recvfrom(65536)
            except BlockingIOError:
                return

    def close(self) -> None:
        self.sock.close()


async def set_mode_guided(gcs: Gcs) -> None:
    """DO_SET_MODE GUIDED, again until accepted: the vehicle refuses it until its position estimate is good.

    Out of BOOT first: as ArduPilot, the sim accepts a mode while it boots and reverts it on leaving BOOT.
    """
    await gcs.recv(lambda x: _hb(x) and x.system_status >= m.MAV_STATE_STANDBY, timeout_s=30)
    for _ in range(30):
        await gcs.send(m.MAVLink_command_long_message(1, 1, m.MAV_CMD_DO_SET_MODE, 0,
                                                      m.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED, GUIDED, 0, 0, 0, 0, 0))
        ack = await gcs.recv(lambda x: x.get_type() == "COMMAND_ACK" and x.target_system == gcs.mav.srcSystem)
        if ack.result == m.MAV_RESULT_ACCEPTED:
            return
        await anyio.sleep(0.3)
    raise AssertionError("GUIDED refused for 9 s")


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _hb(msg: Any, sysid: int = 1) -> bool:
    return bool(msg.get_type() == "HEARTBEAT" and msg.get_srcSystem() == sysid)


@pytest.fixture
async def sim1() -> AsyncIterator[SimFleet]:
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=4.0)) as fleet:
        yield fleet


def _cfg(nats_server: NatsServer, fleet: SimFleet, tmp_path: Path, *routes: str, **kw: Any) -> GatewayConfig:
    cfg = gateway_config(nats_server.url, fleet.endpoints, tmp_path / "state", **kw)
    return replace(cfg, routes=tuple(parse_route(r) for r in routes))


async def test_ground_station_on_a_udp_route_sees_params_and_changes_mode(
        provisioned: Client, nats_server: NatsServer, sim1: SimFleet, tmp_path: Path) -> None:
    gcs = Gcs()
    listen = _free_udp_port()
    # One udpout: route to this ground station, one filtered udp: listen route that must see nothing of sysid 1.
    quiet = Gcs(sysid=254, peer=("127.0.0.1", listen))
    cfg = _cfg(nats_server, sim1, tmp_path, f"udpout:127.0.0.1:{gcs.port}",
               f"udp:127.0.0.1:{listen}?sysid=42", metrics_port=0)
    try:
        async with running(Gateway(cfg)) as gw:
            # as with ArduPilot: a mode set before STANDBY is overridden when the vehicle leaves BOOT
            await gcs.recv(lambda x: _hb(x) and x.system_status == m.MAV_STATE_STANDBY)
            await gcs.send(m.MAVLink_heartbeat_message(6, 8, 0, 0, 4, 3))
            await gcs.send(m.MAVLink_param_request_read_message(1, 1, b"MAV_SYSID", -1))
            pv = await gcs.recv(lambda x: x.get_type() == "PARAM_VALUE" and x.param_id == "MAV_SYSID")
            assert pv.param_value == 1
            await set_mode_guided(gcs)
            await gcs.recv(lambda x: _hb(x) and x.custom_mode == GUIDED)
            # The gateway kept publishing the vehicle's state, and saw the ground station's mode change.
            js = provisioned.jetstream()

            async def guided_published() -> bool:
                st = await current_state(js, ENV, "VID-001")
                rec = st.get(("VID-001", "status"))
                return rec is not None and rec.data.get("mode") == "GUIDED"

            await wait_for_async(guided_published, timeout_s=10)
            # The filtered route: a peer registered, yet no frame from sysid 1 reached it.
            await quiet.send(m.MAVLink_heartbeat_message(6, 8, 0, 0, 4, 3))
            await anyio.sleep(1.0)
            hub = gw.services[0].hubs["VID-001"]  # type: ignore[attr-defined]
            out = hub.stats[f"udp:127.0.0.1:{listen}"]
            assert out.frames_out == 0 and out.filtered > 0 and out.frames_in >= 1
            st = hub.stats[f"udpout:127.0.0.1:{gcs.port}"]
            assert st.frames_out > 10 and st.frames_in >= 3
            body = await anyio.to_thread.run_sync(_metrics, gw.metrics_port)
            assert f'mavjet_route_frames_total{{direction="out",route="udpout:127.0.0.1:{gcs.port}",vid="VID-001"}}' in body
    finally:
        gcs.close()
        quiet.close()


def _metrics(port: int | None) -> str:
    from urllib.request import urlopen

    return str(urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode())


async def test_an_echoing_route_does_not_loop(provisioned: Client, nats_server: NatsServer, sim1: SimFleet,
                                              tmp_path: Path) -> None:
    """A peer that sends every frame back (a misconfigured forwarder): nothing reaches the vehicle twice."""
    echo = Gcs()
    cfg = _cfg(nats_server, sim1, tmp_path, f"udpout:127.0.0.1:{echo.port}")
    loop = asyncio.get_running_loop()
    try:
        async with running(Gateway(cfg)) as gw:
            hub = gw.services[0].hubs["VID-001"]  # type: ignore[attr-defined]
            with anyio.move_on_after(2.0):
                while True:
                    data, addr = await loop.sock_recvfrom(echo.sock, 65536)
                    await loop.sock_sendto(echo.sock, data, addr)
            st = hub.stats[f"udpout:127.0.0.1:{echo.port}"]
            assert st.loops > 10
            assert st.frames_in == 0
    finally:
        echo.close()


async def test_two_routes_reach_each_other_like_mavlink_router(provisioned: Client, nats_server: NatsServer,
                                                               sim1: SimFleet, tmp_path: Path) -> None:
    """Two ground stations on two UDP routes: broadcasts and frames targeted at the other cross over, frames
    for the vehicle do not, and nothing comes back to its sender."""
    a, b = Gcs(sysid=255), Gcs(sysid=254)
    cfg = _cfg(nats_server, sim1, tmp_path, f"udpout:127.0.0.1:{a.port}", f"udpout:127.0.0.1:{b.port}")
    try:
        async with running(Gateway(cfg)) as gw:
            await a.recv(_hb)
            await b.recv(_hb)
            # Each introduces itself; the other one sees the heartbeat (a broadcast).
            for _ in range(20):
                await a.send(m.MAVLink_heartbeat_message(6, 8, 0, 0, 4, 3))
                await b.send(m.MAVLink_heartbeat_message(6, 8, 0, 0, 4, 3))
                with anyio.move_on_after(0.3):
                    await b.recv(lambda x: _hb(x, 255))
                with anyio.move_on_after(0.3):
                    await a.recv(lambda x: _hb(x, 254))
                if any(_hb(x, 255) for x in b.received) and any(_hb(x, 254) for x in a.received):
                    break
            assert any(_hb(x, 255) for x in b.received) and any(_hb(x, 254) for x in a.received)
            # Targeted at the other station: delivered to it (and only to it).
            await a.send(m.MAVLink_command_long_message(254, 190, m.MAV_CMD_REQUEST_MESSAGE, 0, 1, 0, 0, 0, 0, 0, 0))
            got = await b.recv(lambda x: x.get_type() == "COMMAND_LONG" and x.get_srcSystem() == 255)
            assert (got.target_system, got.command) == (254, m.MAV_CMD_REQUEST_MESSAGE)
            # Targeted at the vehicle: the vehicle answers, the other station never sees the request.
            await a.send(m.MAVLink_param_request_read_message(1, 1, b"MAV_SYSID", -1))
            await a.recv(lambda x: x.get_type() == "PARAM_VALUE" and x.param_id == "MAV_SYSID")
            await anyio.sleep(0.5)
            assert not [x for x in b.received if x.get_type() == "PARAM_REQUEST_READ"]
            assert not [x for x in a.received if x.get_srcSystem() == 255]  # nothing back to its sender
            assert not [x for x in b.received if x.get_srcSystem() == 254]
            hub = gw.services[0].hubs["VID-001"]  # type: ignore[attr-defined]
            sa, sb = hub.stats[f"udpout:127.0.0.1:{a.port}"], hub.stats[f"udpout:127.0.0.1:{b.port}"]
            assert sb.frames_routed >= 2 and sa.frames_routed >= 1
            assert sa.loops == 0 and sb.loops == 0
    finally:
        a.close()
        b.close()


async def test_mission_transfers_do_not_collide(provisioned: Client, nats_server: NatsServer, sim1: SimFleet,
                                                tmp_path: Path) -> None:
    gcs = Gcs()
    cfg = _cfg(nats_server, sim1, tmp_path, f"udpout:127.0.0.1:{gcs.port}")
    try:
        async with running(Gateway(cfg)) as gw:
            session = gw.twins["VID-001"].session
            await gcs.recv(_hb)
            # 1. The gateway is transferring: the ground station's start is refused at once, with a reason.
            async with session.transfer_lock:
                await gcs.send(m.MAVLink_mission_request_list_message(1, 1, 0))
                ack = await gcs.recv(lambda x: x.get_type() == "MISSION_ACK")
            assert ack.type == m.MAV_MISSION_DENIED and ack.get_srcSystem() == 1
            # 2. The ground station is transferring: the gateway's download waits for it, then both end cleanly.
            await gcs.send(m.MAVLink_mission_request_list_message(1, 1, 0))
            count = await gcs.recv(lambda x: x.get_type() == "MISSION_COUNT")
            result: list[Any] = []

            async def ours() -> None:
                result.append(await session.download_mission())

            async with anyio.create_task_group() as tg:
                tg.start_soon(ours)
                await anyio.sleep(0.5)
                assert not result and session.transfer_lock.locked()
                for seq in range(count.count):
                    await gcs.send(m.MAVLink_mission_request_int_message(1, 1, seq, 0))
                    await gcs.recv(lambda x, s=seq: x.get_type() == "MISSION_ITEM_INT" and x.seq == s)
                await gcs.send(m.MAVLink_mission_ack_message(1, 1, m.MAV_MISSION_ACCEPTED, 0))
            assert isinstance(result[0], list)
            assert gw.services[0].hubs["VID-001"].stats[f"udpout:127.0.0.1:{gcs.port}"].refused == 1  # type: ignore[attr-defined]
    finally:
        gcs.close()


class _NullTap:
    target_system = 1
    target_component = 1

    def tap_frames(self, handler: Any) -> Callable[[], None]:
        return lambda: None

    async def send_raw(self, data: bytes) -> None:
        return None


async def test_routing_overhead_per_frame(capsys: pytest.CaptureFixture[str]) -> None:
    """Per-frame routing cost, vehicle -> one route (`pytest -s -k overhead` prints it).

    Three parts: the link tap framing the bytes again, the router's fan-out
    (filter, loop table, counters), and the fan-out with a real udpout: send.
    """
    from mavjet.drivers.mavlink.routeports import open_route_port
    from mavjet.drivers.mavlink.router import FrameSplitter
    from mavjet.drivers.mavlink.transport import Endpoint

    mav = m.MAVLink(None, srcSystem=1, srcComponent=1)
    frames = [bytes(m.MAVLink_global_position_int_message(i, 1, 2, 3, 4, 5, 6, 7, 8).pack(mav)) for i in range(100)]
    n = 1000

    def per_frame_us(fn: Callable[[], object], reps: int) -> float:
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t0) / (reps * len(frames)) * 1e6

    sp = FrameSplitter()
    data = b"".join(frames)
    split_us = per_frame_us(lambda: sp.feed(data), n // 4)
    hub = RouteHub("VID-001", _NullTap(), None)
    hub.add_route("gcs", lambda frame: True, RouteFilter())
    fanout_us = per_frame_us(lambda: hub.on_vehicle(frames), n)
    hub.close()
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    sink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)  # overflows: the kernel drops, as a slow GCS would
    port = await open_route_port(Endpoint.parse(f"udpout:127.0.0.1:{sink.getsockname()[1]}"), lambda p, d: None)
    hub = RouteHub("VID-001", _NullTap(), None)
    hub.add_route("gcs", port.send_nowait, RouteFilter())
    udp_us = per_frame_us(lambda: hub.on_vehicle(frames), n // 10)
    hub.close()
    port.close()
    sink.close()
    # Route -> vehicle and route -> route: a ground station's broadcast frames, framed, checked for loops,
    # queued for the vehicle and handed to a second route.
    gcs_mav = m.MAVLink(None, srcSystem=255, srcComponent=190)
    gcs_data = b"".join(bytes(m.MAVLink_heartbeat_message(6, 8, 0, 0, 4, 3).pack(gcs_mav)) for _ in frames)
    hub = RouteHub("VID-001", _NullTap(), None, buffer=len(frames) * (n // 10) + 1)
    hub.add_route("gcs1", lambda frame: True, RouteFilter())
    hub.add_route("gcs2", lambda frame: True, RouteFilter())
    r2r_us = per_frame_us(lambda: hub.from_route("gcs1", "peer", gcs_data), n // 10)
    routed = hub.stats["gcs2"].frames_routed
    hub.close()
    with capsys.disabled():
        print(f"\nrouting overhead per frame: tap framing {split_us:.2f} us, fan-out {fanout_us:.2f} us, "
              f"fan-out + udp send {udp_us:.2f} us, route -> vehicle + other route {r2r_us:.2f} us")
    # The figures are printed, not bounded: a shared machine's speed is no test (docs/benchmarks.md).
    assert routed == len(frames) * (n // 10)


def test_route_config_parsing() -> None:
    r = parse_route("udp:0.0.0.0:14550?vid=VID-001&sysid=1,2&compid=1")
    assert (str(r.endpoint), r.vid, r.sysids, r.compids) == ("udp:0.0.0.0:14550", "VID-001", frozenset({1, 2}), frozenset({1}))
    from mavjet.contract.errors import ConfigError
    from mavjet.gateway.resolve import build_config

    raw = {"vehicles": [{"vid": "A", "endpoint": "tcp:h:1", "tunnel": True}, {"vid": "B", "endpoint": "tcp:h:2"}],
           "routes": [{"endpoint": "tcp:0.0.0.0:5790", "vid": "B", "sysids": [1]}]}
    cfg = build_config(raw, nats=None)
    assert cfg.routes[0].vid == "B" and [cfg.tunnel_for(v) for v in cfg.vehicles] == [True, False]
    with pytest.raises(ConfigError, match=r"routes\.vid"):
        build_config({**raw, "routes": ["tcp:0.0.0.0:5790"]}, nats=None)
    with pytest.raises(ConfigError, match="--route"):
        parse_route("udp:0.0.0.0:14550?bogus=1")
    from mavjet.gateway.entry import build_parser, config_from_args

    args = build_parser().parse_args(["--vehicle", "VID-001=tcp:127.0.0.1:5760", "--route", "udp:0.0.0.0:14550",
                                      "--route", "tcp:0.0.0.0:5790?compid=1"])
    cfg = config_from_args(args, environ={})
    assert [str(r.endpoint) for r in cfg.routes] == ["udp:0.0.0.0:14550", "tcp:0.0.0.0:5790"]
    assert cfg.route_vid(cfg.routes[1]) == "VID-001" and cfg.routes[1].compids == frozenset({1})
    assert not cfg.tunnel_for(cfg.vehicles[0])
