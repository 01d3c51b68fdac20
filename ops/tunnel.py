"""`mavjet tunnel VID --listen udp:127.0.0.1:14550`: a vehicle's raw MAVLink on the operator's laptop.

The gateway serving VID (with `tunnel = true`) publishes every frame it
receives from the vehicle on core NATS `fleet.<env>.veh.<vid>.mav.down` and
sends the vehicle every frame published on `.mav.up` (gateway/routes.py).
This command bridges those two subjects to a local endpoint, so QGroundControl
or MAVProxy on the laptop sees the vehicle as if it were on the radio:

- `udpout:127.0.0.1:14550` sends to a ground station listening there
  (QGroundControl's default);
- `udp:127.0.0.1:14550` listens, for a ground station that connects to it
  (`mavproxy.py --master udpout:127.0.0.1:14550`);
- `tcp:127.0.0.1:5760` serves TCP clients.

Frames go each way untouched (a signed frame keeps its signature). Each
frame from the vehicle is sent as its own datagram, as a radio would.
Publishing on `.mav.up` is an operator permission (docs/companion.md).
"""

from __future__ import annotations

import argparse
import sys

import anyio
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from mavjet.contract import natsconn
from mavjet.contract.errors import ConfigError
from mavjet.contract.subjects import STATE_STREAM, check_token, mav_down_subject, mav_up_subject
from mavjet.drivers.mavlink.routeports import RoutePort, open_route_port
from mavjet.drivers.mavlink.router import FrameSplitter
from mavjet.drivers.mavlink.transport import Endpoint
from mavjet.gateway.routes import NatsTunnelPort
from mavjet.ops import resolve
from mavjet.ops.runner import run_cli

PROBE_TIMEOUT_S = 0.5


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mavjet tunnel",
        description="Bridge a vehicle's raw MAVLink (core NATS) to a local ground station endpoint.",
        epilog="Example: mavjet tunnel VID-001 --listen udpout:127.0.0.1:14550   (QGroundControl listens there)",
    )
    p.add_argument("vid", help="the vehicle whose MAVLink to bridge")
    p.add_argument("--listen", default="udpout:127.0.0.1:14550", metavar="ENDPOINT",
                   help="udp:HOST:PORT (listen), udpout:HOST:PORT (send to a listening ground station) "
                   "or tcp:HOST:PORT (server); default udpout:127.0.0.1:14550")
    p.add_argument("--quiet-warn-s", type=float, default=5.0,
                   help="warn when no frame arrives from the vehicle this long (default 5 s)")
    natsconn.add_nats_arguments(p)
    return p


class Tunnel:
    """The laptop's end: `.mav.down` → the local endpoint, the local endpoint → `.mav.up`."""

    def __init__(self, nc: Client, env: str, vid: str) -> None:
        self.nc = nc
        self.down = mav_down_subject(env, vid)
        self.up = NatsTunnelPort(mav_up_subject(env, vid))
        self.up.nc = nc
        self.port: RoutePort | None = None
        self.frames_down = 0
        self.frames_up = 0
        self._splitter = FrameSplitter()

    def _from_local(self, peer: object, data: bytes) -> None:
        if self.up.send_nowait(data):
            self.frames_up += 1

    async def _from_vehicle(self, msg: Msg) -> None:
        port = self.port
        if port is None:
            return
        for frame in self._splitter.feed(msg.data):
            if port.send_nowait(frame):
                self.frames_down += 1

    async def run(self, endpoint: Endpoint, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
                  quiet_warn_s: float = 5.0) -> None:
        self.port = await open_route_port(endpoint, self._from_local)
        sub = await self.nc.subscribe(self.down, cb=self._from_vehicle)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.up.run)
                task_status.started()
                await anyio.sleep(quiet_warn_s)
                if not self.frames_down:
                    print(f"mavjet tunnel: nothing on {self.down} yet: is `tunnel = true` set on its gateway, "
                          "and is a ground station connected?", file=sys.stderr)
        finally:
            with anyio.CancelScope(shield=True):
                await sub.unsubscribe()
            self.port.close()


async def tunnel_served(nc: Client, up_subject: str, *, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether anything subscribes to the vehicle's `.mav.up`: a gateway with `tunnel = true` for it does.

    An empty request: with no subscriber the server answers "no responders" at
    once; a gateway's tunnel takes it as zero bytes of MAVLink (nothing is sent
    to the vehicle) and does not reply, so the wait runs out: served.
    """
    try:
        await nc.request(up_subject, b"", timeout=timeout_s)
    except nats.errors.NoRespondersError:
        return False
    except nats.errors.TimeoutError:
        return True
    return True


async def _run(args: argparse.Namespace) -> int:
    check_token("vid", args.vid)
    check_token("env", args.env)
    endpoint = Endpoint.parse(args.listen)
    if endpoint.scheme not in ("udp", "udpout", "tcp"):
        raise ConfigError("--listen", f"{endpoint}: expected udp:, udpout: or tcp:HOST:PORT")
    # Reconnects once connected (a tunnel runs for hours); a refused first connect ends at once.
    nc = await resolve.connect(args, name="mavjet-tunnel", allow_reconnect=True, max_reconnect_attempts=-1)
    tunnel = Tunnel(nc, args.env, args.vid)
    try:
        vehicle = await resolve.vehicle(nc, args.env, args.vid, needs=(STATE_STREAM,))
        resolve.require_served(vehicle, why="there is no MAVLink to tunnel")
        if not await tunnel_served(nc, tunnel.up.subject):
            raise resolve.VehicleGone(f"no gateway serves a tunnel for {args.vid} (nobody subscribes to "
                              f"{tunnel.up.subject}): set `tunnel = true` for it in its gateway's config "
                              "(docs/ground-stations.md)")
        print(f"mavjet tunnel: {args.vid} <-> {endpoint} (subjects {tunnel.down}, {tunnel.up.subject}); Ctrl-C stops",
              flush=True)
        await tunnel.run(endpoint, quiet_warn_s=args.quiet_warn_s)
        await anyio.sleep_forever()
    finally:
        with anyio.CancelScope(shield=True):
            await nc.close()
    return 0


def main(argv: list[str]) -> int:
    return run_cli(build_parser(), _run, argv)
