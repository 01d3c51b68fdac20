"""Ground stations through the gateway: local routes (`--route`) and the NATS tunnel.

On a companion computer the gateway owns the autopilot's port, so it also
does mavlink-router's job. Per vehicle a `RouteHub` taps the link's raw
frames (`mavjet.drivers.mavlink.link.FrameTap`) and:

- sends every vehicle frame, as received (a signed frame keeps its
  signature), to every route whose filter accepts its source
  (`mavjet.drivers.mavlink.router.Router`, with mavlink-router's loop prevention);
- forwards every frame a route sends to the vehicle, untouched, through one
  task that also keeps transfers apart;
- forwards a route's frame to the other routes of the same hub as
  mavlink-router does (`Router.to_routes`): broadcast frames to all, targeted
  ones to the route where the target was seen, never back to the route it
  came from; so two ground stations (or a ground station and a companion
  app) see each other. The tunnel has its own hub: tunnel and socket routes
  do not exchange frames.

Transfers. An autopilot serves one mission-protocol transfer at a time, and
mavjet's own (commands, the shadow) hold the session's transfer lock. A
ground station's MISSION_COUNT / MISSION_REQUEST_LIST / MISSION_CLEAR_ALL
takes that same lock, without waiting, for as long as its transfer runs (until
the MISSION_ACK that ends it, or `guard_idle_s` without a mission frame):
- while mavjet transfers, the ground station's start is refused at once with
  MISSION_ACK(MAV_MISSION_DENIED) from the vehicle's ids, so it fails with a
  clear error instead of interleaving with ours;
- while the ground station transfers, mavjet's transfer waits for the lock
  and then runs; both end cleanly.
Commands (COMMAND_LONG) need no guard: each carries its own ACK.

`RouteService` serves the socket routes of the config, `TunnelService` the
core NATS subjects `fleet.<env>.veh.<vid>.mav.down` (every vehicle frame,
batched per wake-up) and `.mav.up` (frames for the vehicle) of each vehicle
with `tunnel` enabled; `mavjet tunnel` (ops/tunnel.py) is the
operator's end.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from functools import partial

import anyio
import structlog
from anyio.abc import TaskStatus
from nats.aio.client import Client
from nats.aio.msg import Msg

from mavjet.contract.errors import LinkError
from mavjet.contract.subjects import mav_down_subject, mav_up_subject
from mavjet.drivers.mavlink.link import FrameTap
from mavjet.drivers.mavlink.routeports import RoutePort, open_route_port
from mavjet.drivers.mavlink.router import (
    FrameSplitter,
    RouteFilter,
    Router,
    RouteStats,
    TransferStep,
    frame_msgid,
    frame_source,
    refusal,
    transfer_step,
)
from mavjet.gateway.config import RouteConfig
from mavjet.gateway.services import ServiceContext

log = structlog.get_logger("mavjet.routes")

Sender = Callable[[bytes], bool]
_END = "\x00vehicle-ack"  # queue marker: the vehicle acknowledged the ground station's transfer


class RouteHub:
    """One vehicle's routes: fan-out from the tap, fan-in through one forwarding task (see the module docstring)."""

    def __init__(self, vid: str, tap: FrameTap, lock: anyio.Lock | None, *,
                 guard_idle_s: float = 5.0, buffer: int = 1024) -> None:
        self.vid = vid
        self.tap = tap
        self.lock = lock
        self.guard_idle_s = guard_idle_s
        self.router = Router()
        self._senders: dict[str, Sender] = {}
        self._splitters: dict[tuple[str, object], FrameSplitter] = {}
        self._send, self._recv = anyio.create_memory_object_stream[tuple[str, bytes]](buffer)
        # The ground station holding the transfer lock: (route, its (sysid, compid)), or None.
        self._owner: tuple[str, tuple[int, int]] | None = None

    @property
    def stats(self) -> dict[str, RouteStats]:
        return self.router.stats

    def add_route(self, name: str, sender: Sender, flt: RouteFilter | None = None) -> None:
        self.router.add_route(name, flt)
        self._senders[name] = sender

    # -- vehicle -> routes (the link's receive callback: never waits) -------
    def on_vehicle(self, frames: list[bytes]) -> None:
        now = time.monotonic()
        route_of = self.router.from_vehicle
        stats = self.router.stats
        senders = self._senders
        owner = self._owner
        for frame in frames:
            for name in route_of(frame, now):
                st = stats[name]
                if senders[name](frame):
                    st.frames_out += 1
                    st.bytes_out += len(frame)
                else:
                    st.dropped += 1
            if owner is not None and transfer_step(frame) is TransferStep.END and _ack_target(frame) == owner[1]:
                self._queue(_END, b"")

    # -- routes -> vehicle --------------------------------------------------
    def from_route(self, name: str, peer: object, data: bytes) -> None:
        """Bytes a route's peer sent (a transport callback): frame them per peer, queue them for the vehicle."""
        key = (name, peer)
        splitter = self._splitters.get(key)
        if splitter is None:
            if len(self._splitters) > 64:  # TCP clients come and go: forget the old streams
                self._splitters.clear()
            splitter = self._splitters[key] = FrameSplitter()
        now = time.monotonic()
        router = self.router
        for frame in splitter.feed(data):
            if router.from_route(name, frame, now):
                self._queue(name, frame)
                for other in router.to_routes(name, frame) if len(self._senders) > 1 else ():
                    st = router.stats[other]
                    if self._senders[other](frame):
                        st.frames_out += 1
                        st.bytes_out += len(frame)
                        st.frames_routed += 1
                    else:
                        st.dropped += 1

    def _queue(self, name: str, frame: bytes) -> None:
        try:
            self._send.send_nowait((name, frame))
        except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
            if name in self.router.stats:
                self.router.stats[name].dropped += 1

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Forward route frames to the vehicle; own the transfer lock for a ground station's transfer."""
        untap = self.tap.tap_frames(self.on_vehicle)
        task_status.started()
        deadline = 0.0
        try:
            while True:
                item: tuple[str, bytes] | None = None
                if self._owner is None:
                    item = await self._recv.receive()
                else:
                    with anyio.move_on_after(max(0.0, deadline - time.monotonic())):
                        item = await self._recv.receive()
                    if item is None:
                        self._release("idle")
                        continue
                name, frame = item
                if name == _END:
                    self._release("acknowledged")
                    continue
                step = transfer_step(frame) if self.lock is not None else TransferStep.NONE
                if step is TransferStep.START and not self._begin(name, frame):
                    continue
                if step is not TransferStep.NONE and self._owner is not None:
                    deadline = time.monotonic() + self.guard_idle_s
                try:
                    await self.tap.send_raw(frame)
                except LinkError:
                    self.router.stats[name].dropped += 1
                if step is TransferStep.END and self._owner is not None and self._owner[0] == name:
                    self._release("acknowledged")  # the ground station ended its download
        finally:
            untap()
            if self._owner is not None:
                self._release("stopped")
            self.close()

    def close(self) -> None:
        self._send.close()
        self._recv.close()

    def _begin(self, name: str, frame: bytes) -> bool:
        """A ground station starts a transfer: take the lock, or refuse with MISSION_ACK(DENIED)."""
        src = frame_source(frame)
        if self._owner is not None:
            if self._owner == (name, src):
                return True  # it restarted its own transfer
            return self._refuse(name, frame, "another ground station is transferring")
        assert self.lock is not None
        try:
            self.lock.acquire_nowait()
        except anyio.WouldBlock:
            return self._refuse(name, frame, "the gateway is transferring")
        self._owner = (name, src)
        return True

    def _refuse(self, name: str, frame: bytes, why: str) -> bool:
        self.router.stats[name].refused += 1
        log.warning("route_transfer_refused", vehicle=self.vid, route=name, msgid=frame_msgid(frame), reason=why)
        self._senders[name](refusal(frame, vehicle_sysid=self.tap.target_system,
                                    vehicle_compid=self.tap.target_component))
        return False

    def _release(self, why: str) -> None:
        if self._owner is not None and self.lock is not None:
            self._owner = None
            self.lock.release()
            log.debug("route_transfer_done", vehicle=self.vid, reason=why)


def _ack_target(frame: bytes) -> tuple[int, int]:
    """(target_system, target_component) of a MISSION_ACK frame (the first two payload bytes)."""
    off = 10 if frame[0] == 0xFD else 6
    body = frame[off:off + 2] + b"\x00\x00"
    return body[0], body[1]


class RouteService:
    """The `--route` endpoints of the config, one `RouteHub` per routed vehicle (a GatewayService)."""

    def __init__(self, routes: tuple[RouteConfig, ...], *, taps: Mapping[str, FrameTap],
                 locks: Mapping[str, anyio.Lock]) -> None:
        self.routes = routes
        self.taps = taps
        self.locks = locks
        self.hubs: dict[str, RouteHub] = {}

    async def run(self, ctx: ServiceContext, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        ports: list[RoutePort] = []
        try:
            for r in self.routes:
                vid = ctx.cfg.route_vid(r)
                hub = self.hubs.get(vid)
                if hub is None:
                    hub = self.hubs[vid] = RouteHub(vid, self.taps[vid], self.locks.get(vid))
                name = str(r.endpoint)
                port = await open_route_port(r.endpoint, partial(hub.from_route, name))
                ports.append(port)
                hub.add_route(name, port.send_nowait, RouteFilter(sysids=r.sysids, compids=r.compids))
                log.info("route_open", vehicle=vid, route=name)
            async with anyio.create_task_group() as tg:
                for vid, hub in self.hubs.items():
                    await tg.start(hub.run, name=f"vehicle[{vid}].routes")
                task_status.started()
        finally:
            for port in ports:
                port.close()


class NatsTunnelPort:
    """The tunnel's end in the gateway: vehicle frames batched per wake-up onto `.mav.down`."""

    def __init__(self, subject: str, *, max_batch_bytes: int = 32 * 1024) -> None:
        self.subject = subject
        self.max_batch_bytes = max_batch_bytes
        self.nc: Client | None = None
        self._batch: list[bytes] = []
        self._size = 0
        self._wake = anyio.Event()

    def send_nowait(self, frame: bytes) -> bool:
        if self.nc is None or not self.nc.is_connected or self._size > self.max_batch_bytes:
            return False
        self._batch.append(frame)
        self._size += len(frame)
        self._wake.set()
        return True

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            batch, self._batch, self._size = self._batch, [], 0
            nc = self.nc
            if batch and nc is not None:
                try:
                    await nc.publish(self.subject, b"".join(batch))
                except Exception as exc:
                    log.debug("tunnel_publish_failed", subject=self.subject, error=str(exc))


class TunnelService:
    """Raw MAVLink over core NATS for each vehicle with `tunnel` enabled (a GatewayService)."""

    NAME = "nats"

    def __init__(self, vids: tuple[str, ...], *, taps: Mapping[str, FrameTap], locks: Mapping[str, anyio.Lock]) -> None:
        self.vids = vids
        self.taps = taps
        self.locks = locks
        self.hubs: dict[str, RouteHub] = {}

    async def run(self, ctx: ServiceContext, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        env = ctx.cfg.env
        ports: dict[str, NatsTunnelPort] = {}
        async with anyio.create_task_group() as tg:
            for vid in self.vids:
                hub = self.hubs[vid] = RouteHub(vid, self.taps[vid], self.locks.get(vid))
                port = ports[vid] = NatsTunnelPort(mav_down_subject(env, vid))
                hub.add_route(self.NAME, port.send_nowait)
                await tg.start(hub.run, name=f"vehicle[{vid}].tunnel")
                tg.start_soon(port.run, name=f"vehicle[{vid}].tunnel.down")
            task_status.started()
            nc: Client | None = None
            while True:
                await ctx.nats.connected.wait()
                if ctx.nats.nc is not nc and ctx.nats.nc is not None:
                    nc = ctx.nats.nc  # a new connection object: subscribe on it (nats-py resubscribes on reconnects)
                    for vid, hub in self.hubs.items():
                        ports[vid].nc = nc
                        await nc.subscribe(mav_up_subject(env, vid), cb=partial(_up, hub))
                    log.info("tunnel_open", vehicles=list(self.hubs))
                await anyio.sleep(1.0)


async def _up(hub: RouteHub, msg: Msg) -> None:
    hub.from_route(TunnelService.NAME, "nats", msg.data)
