"""Routing keeps MAVLink 2 signatures, both ways: the ground station holds the key, not the route.

The sim is provisioned with a key (`mavjet sign setup`); the gateway, with the
key, serves it on the vehicle's second port (which, like SITL's SERIAL1,
ignores unsigned frames); a udpout: route carries the frames to a ground
station and back, and a TCP route serves a second client.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from nats.aio.client import Client

from mavjet.drivers.mavlink.dialect import mavlink2 as m
from mavjet.drivers.mavlink.router import FrameSplitter, frame_source
from mavjet.drivers.mavlink.signing import MavSigning, Verdict, read_key_file
from mavjet.gateway.config import parse_route
from mavjet.gateway.daemon import Gateway
from mavjet.ops import sign
from mavjet.ops.natsserver import NatsServer
from mavjet.sim.fleet import SimConfig, SimFleet
from tests.gateway.test_routes import Gcs, _free_udp_port
from tests.support import gateway_config, running, wait_for


async def test_signed_frames_pass_both_ways_untouched(provisioned: Client, nats_server: NatsServer,
                                                      tmp_path: Path) -> None:
    key_file = tmp_path / "VID-001.key"
    assert sign.main(["keygen", str(key_file)]) == 0
    key = read_key_file(key_file)
    gcs = Gcs()
    tcp_port = _free_udp_port()  # free on tcp too, in practice, on loopback
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=5.0)) as fleet:
        v = fleet.vehicles[0]
        assert await asyncio.to_thread(sign.main, ["setup", "VID-001", "--endpoint", fleet.endpoints[0],
                                                   "--key-file", str(key_file), "--timeout", "5"]) == 0
        serial1 = await v.listen_serial(1)
        cfg = gateway_config(nats_server.url, [serial1], tmp_path / "state")
        cfg = dataclasses.replace(
            cfg, vehicles=tuple(dataclasses.replace(vc, signing_key_file=key_file) for vc in cfg.vehicles),
            routes=(parse_route(f"udpout:127.0.0.1:{gcs.port}"), parse_route(f"tcp:127.0.0.1:{tcp_port}")))
        try:
            async with running(Gateway(cfg)):
                # Vehicle -> ground station: the frames arrive signed, and the signature checks out with the key.
                await gcs.recv(lambda x: x.get_type() == "HEARTBEAT" and x.get_srcSystem() == 1)
                frames = [f for d in gcs.raw for f in FrameSplitter().feed(d) if frame_source(f) == (1, 1)]
                assert frames and all(f[2] & 1 for f in frames)
                assert MavSigning(key).verify(frames[-1], m.MAVLINK_MSG_ID_HEARTBEAT) is Verdict.OK
                # Ground station -> vehicle: an unsigned request is dropped by the vehicle, a signed one answered.
                unverified = v.link.frames_in_unverified
                await gcs.send(m.MAVLink_param_request_read_message(1, 1, b"MAV_SYSID", -1))
                await wait_for(lambda: v.link.frames_in_unverified > unverified, timeout_s=5)
                MavSigning(key, link_id=7).attach(gcs.mav)
                await gcs.send(m.MAVLink_param_request_read_message(1, 1, b"MAV_SYSID", -1))
                pv = await gcs.recv(lambda x: x.get_type() == "PARAM_VALUE" and x.param_id == "MAV_SYSID")
                assert pv.param_value == 1
                # A TCP client of the tcp: route gets the same stream.
                reader, writer = await asyncio.open_connection("127.0.0.1", tcp_port)
                try:
                    splitter = FrameSplitter()
                    got: list[bytes] = []
                    while not any(frame_source(f) == (1, 1) for f in got):
                        got += splitter.feed(await asyncio.wait_for(reader.read(4096), 5))
                    assert all(f[2] & 1 for f in got if frame_source(f) == (1, 1))
                finally:
                    writer.close()
        finally:
            gcs.close()
