"""A simulated vehicle's link: TCP listener, framing, and fault injection.

`SimVehicle` is the sans-IO `VehicleModel` plus the part that touches
sockets. Like ArduPilot SITL it listens on a TCP port; every connected
client receives the full stream and may send; the vehicle answers everyone.

I/O uses asyncio `Protocol`s rather than streams: with a thousand vehicles
the load generator cannot afford a reader task per connection, and
`data_received` hands whole buffers to the parser (one wake-up per read,
not per frame). Output is framed once per tick per vehicle and written to
each client with a single `write()`; a client that stops reading loses
frames (counted) once its buffer passes `WRITE_BUFFER_LIMIT`, like a
saturated radio, instead of growing memory without bound.

Fault injection (all counted in `link`):
- `loss` / `corrupt`: probability per outgoing frame of dropping it
  (its sequence number is still used, so the receiver sees a gap) or of
  flipping one bit after the header, which the receiver sees as a bad CRC.
- `loss_in`: probability of ignoring an incoming frame.
- `drop_next("COMMAND_ACK", n)` / `drop_next(..., incoming=True)`:
  deterministically lose the next n frames of a type (e.g. lose the ACK of
  an executed command to test retransmission).
- `drop_link(seconds)`: silence both ways with TCP kept open;
  `drop_link(seconds, close=True)` also closes every connection and refuses
  new ones until the time is up. Durations are wall-clock seconds: the link
  is part of the real world, not of simulated time.
- `inject_garbage(n)`: write n random bytes into the stream now.

MAVLink 2 signing (sim/signing.py) as ArduPilot does it: SETUP_SIGNING turns
it on; the main port is SERIAL0 (link id 0, where ArduPilot accepts unsigned
frames even with signing on); `listen_serial(link_id)` opens another port
like SITL's SERIAL1, where unsigned, badly signed and replayed frames are
ignored (counted in `link.frames_in_unverified` and `signing.counters`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from pymavlink.dialects.v20 import ardupilotmega as mavlink2

from mavjet.contract.errors import LinkError
from mavjet.sim.encoder import Encoder, Packer
from mavjet.sim.model import VehicleModel, VehicleOptions
from mavjet.sim.signing import Check, VehicleSigning

log = logging.getLogger(__name__)

WRITE_BUFFER_LIMIT: Final = 256 * 1024  # bytes queued to one client before frames are dropped
_GCS_SYSID: Final = 255


@dataclass(slots=True)
class LinkStats:
    frames_out: int = 0
    bytes_out: int = 0
    frames_lost: int = 0  # loss probability or drop_next
    frames_corrupted: int = 0
    frames_link_down: int = 0  # discarded while the link was dropped
    frames_slow_client: int = 0  # discarded because a client stopped reading
    frames_in_lost: int = 0
    garbage_bytes: int = 0
    connections: int = 0
    disconnects: int = 0
    frames_in_unverified: int = 0  # ignored by signing (unsigned, bad signature, replay) on a link other than 0
    frames_forwarded: int = 0  # ground stations' HEARTBEATs routed to the other clients


class _Client(asyncio.Protocol):
    """One TCP connection to the vehicle (a gateway, a ground station, a test)."""

    def __init__(self, vehicle: SimVehicle, link_id: int = 0) -> None:
        self.vehicle = vehicle
        self.link_id = link_id  # 0: the main port (SERIAL0); others: listen_serial()
        self.transport: asyncio.Transport | None = None
        self.parser = _new_parser()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        v = self.vehicle
        if not v.accepting(time.monotonic()):
            transport.abort()
            return
        self.transport = transport
        v.clients.add(self)
        v.link.connections += 1

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.vehicle.clients:
            self.vehicle.clients.discard(self)
            self.vehicle.link.disconnects += 1
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.vehicle.receive(self, data)


def _new_parser() -> Any:
    parser = mavlink2.MAVLink(None, _GCS_SYSID, 0)
    parser.robust_parsing = True
    return parser


class SimVehicle(VehicleModel):
    """A `VehicleModel` behind a TCP listener, with fault injection."""

    def __init__(
        self,
        opts: VehicleOptions,
        *,
        host: str,
        port: int,
        clock: Callable[[], float],
        encoder: Encoder,
        reboot_s: float = 1.0,
        loss: float = 0.0,
        corrupt: float = 0.0,
        loss_in: float = 0.0,
    ) -> None:
        super().__init__(opts)
        self.host = host
        self.port = port
        self.loss = loss
        self.corrupt = corrupt
        self.loss_in = loss_in
        self.reboot_s = reboot_s
        self.clients: set[_Client] = set()
        self.link = LinkStats()
        self._clock = clock
        self._encoder = encoder
        self._server: asyncio.Server | None = None
        self._seq = 0
        self._silent_until = 0.0  # wall clock
        self._closed_until = 0.0  # wall clock; listener closed by drop_link(close=True)
        self.rebooting_until: float | None = None  # sim time
        self._drop_out: dict[str, int] = {}
        self._drop_in: dict[str, int] = {}
        self.signing = VehicleSigning()
        self._serial_servers: list[asyncio.Server] = []

    # ------------------------------------------------------------------ public
    @property
    def endpoint(self) -> str:
        return f"tcp:{self.host}:{self.port}"

    def link_down(self, wall: float | None = None) -> bool:
        """True while the link is dropped or the vehicle is rebooting."""
        w = time.monotonic() if wall is None else wall
        return w < self._silent_until or self.rebooting_until is not None

    def drop_link(self, seconds: float, *, close: bool = False) -> None:
        """Go silent both ways for `seconds` (wall clock); `close=True` also drops every TCP connection."""
        until = time.monotonic() + max(seconds, 0.0)
        self._silent_until = max(self._silent_until, until)
        if close:
            self._closed_until = max(self._closed_until, until)
            self._close_clients()
            self._close_listener()

    def restore_link(self) -> None:
        """End a `drop_link` early."""
        self._silent_until = 0.0
        self._closed_until = 0.0

    def inject_garbage(self, n_bytes: int) -> bytes:
        """Write `n_bytes` random bytes to every client now; returns them."""
        junk = self.rng.randbytes(max(n_bytes, 0))
        for c in list(self.clients):
            if c.transport is not None:
                c.transport.write(junk)
        self.link.garbage_bytes += len(junk)
        return junk

    def drop_next(self, msg_type: str, count: int = 1, *, incoming: bool = False) -> None:
        """Lose the next `count` frames of `msg_type` (e.g. "COMMAND_ACK"), outgoing or incoming."""
        table = self._drop_in if incoming else self._drop_out
        table[msg_type] = table.get(msg_type, 0) + count

    def clear_drops(self) -> None:
        """Lose nothing more (end every `drop_next`)."""
        self._drop_out.clear()
        self._drop_in.clear()

    # ------------------------------------------------------------------ lifecycle
    async def listen(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(lambda: _Client(self), self.host, self.port, reuse_address=True)
        except OSError as exc:
            raise LinkError(self.endpoint, f"cannot listen: {exc.strerror or exc}") from exc
        sock = self._server.sockets[0]
        self.port = int(sock.getsockname()[1])

    async def listen_serial(self, link_id: int = 1, port: int = 0) -> str:
        """Open another MAVLink port (like SITL's SERIAL1) whose clients are link `link_id`; returns its endpoint."""
        loop = asyncio.get_running_loop()
        try:
            server = await loop.create_server(lambda: _Client(self, link_id), self.host, port, reuse_address=True)
        except OSError as exc:
            raise LinkError(f"tcp:{self.host}:{port}", f"cannot listen: {exc.strerror or exc}") from exc
        self._serial_servers.append(server)
        return f"tcp:{self.host}:{server.sockets[0].getsockname()[1]}"

    async def close(self) -> None:
        for extra in self._serial_servers:
            extra.close()
        self._serial_servers.clear()
        self._close_clients()
        server, self._server = self._server, None
        if server is not None:
            server.close()
            await server.wait_closed()

    def _close_listener(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()

    def _close_clients(self) -> None:
        for c in list(self.clients):
            if c.transport is not None:
                c.transport.close()  # pending output (e.g. the reboot ACK) is flushed first
        self.clients.clear()

    def accepting(self, wall: float) -> bool:
        return self.rebooting_until is None and wall >= self._closed_until

    def needs_service(self, sim_now: float, wall: float) -> bool:
        """True when `service()` has work: finish a reboot or reopen a closed listener."""
        if self.rebooting_until is not None:
            return sim_now >= self.rebooting_until
        return self._server is None and wall >= self._closed_until

    async def service(self, sim_now: float, wall: float) -> None:
        if self.rebooting_until is not None:
            if sim_now < self.rebooting_until:
                return
            self.rebooting_until = None
            self.reboot_now(sim_now)
        if self._server is None and wall >= self._closed_until:
            try:
                await self.listen()
            except LinkError:
                log.warning("vehicle %d: cannot listen again on %s yet", self.sysid, self.endpoint)

    # ------------------------------------------------------------------ tick and I/O
    def tick(self, sim_now: float, wall: float) -> None:
        if self.rebooting_until is not None:
            return
        self.step(sim_now)
        self.flush(wall)

    def receive(self, client: _Client, data: bytes) -> None:
        wall = time.monotonic()
        if self.link_down(wall):
            return
        try:
            msgs = client.parser.parse_buffer(data)
        except Exception:  # pymavlink raises on some malformed input even when robust: resynchronise
            self.stats.bad_frames_in += 1
            client.parser = _new_parser()
            return
        if not msgs:
            return
        now = self._clock()
        for msg in msgs:
            if msg.get_type() == "BAD_DATA":
                self.stats.bad_frames_in += 1
                continue
            if self._drop_in and self._take(self._drop_in, msg.get_type()):
                self.link.frames_in_lost += 1
                continue
            if self.loss_in and self.rng.random() < self.loss_in:
                self.link.frames_in_lost += 1
                continue
            if self.signing.enabled and not self._signature_ok(msg, client.link_id):
                continue
            if msg.get_type() == "HEARTBEAT" and msg.get_srcSystem() != self.sysid:
                self._forward(client, msg)
            if msg.get_type() == "SETUP_SIGNING":
                if msg.target_system in (0, self.sysid):
                    self.signing.setup(bytes(msg.secret_key), int(msg.initial_timestamp))
                continue
            try:
                self.handle(msg, (msg.get_srcSystem(), msg.get_srcComponent()), now, wall)
            except Exception:
                self.stats.handler_errors += 1
                log.exception("vehicle %d: error handling %s", self.sysid, msg.get_type())
        self.flush(wall)

    def _forward(self, source: _Client, msg: Any) -> None:
        """ArduPilot routes a ground station's HEARTBEAT to its other links byte for byte (same sysid/compid,
        seq and signature, as recorded on SITL's SERIAL0/SERIAL1); each other client here is such a link."""
        frame = bytes(msg.get_msgbuf())
        for c in self.clients:
            t = c.transport
            if c is not source and t is not None and t.get_write_buffer_size() <= WRITE_BUFFER_LIMIT:
                t.write(frame)
                self.link.frames_forwarded += 1

    def _signature_ok(self, msg: Any, link_id: int) -> bool:
        verdict = self.signing.check(bytes(msg.get_msgbuf()), msg.get_msgId(), link_id)
        if verdict is Check.SIGNED or verdict is Check.ACCEPTED_UNSIGNED:
            return True
        self.link.frames_in_unverified += 1
        return False

    @staticmethod
    def _take(table: dict[str, int], name: str) -> bool:
        n = table.get(name, 0)
        if n <= 0:
            return False
        if n == 1:
            del table[name]
        else:
            table[name] = n - 1
        return True

    def flush(self, wall: float) -> None:
        """Frame everything the model produced and write it to every client."""
        out = self.out
        if not out:
            if self.reboot_pending:
                self._start_reboot()
            return
        self.out = []
        if wall < self._silent_until or not self.clients:
            if wall < self._silent_until:
                self.link.frames_link_down += len(out)
            self._seq = (self._seq + len(out)) & 0xFF
            if self.reboot_pending:
                self._start_reboot()
            return
        frames: list[bytes] = []
        sysid, compid, seq = self.sysid, self.compid, self._seq
        loss, corrupt, rng, drop = self.loss, self.corrupt, self.rng, self._drop_out
        for item in out:
            if (drop and self._take(drop, _type_name(item))) or (loss and rng.random() < loss):
                self.link.frames_lost += 1
            else:
                if type(item) is tuple:
                    frame = item[0].frame(sysid, compid, seq, item[1])
                else:
                    frame = self._encoder.frame(sysid, compid, seq, item)
                if corrupt and rng.random() < corrupt:
                    buf = bytearray(frame)
                    buf[rng.randrange(10, len(buf))] ^= 1 << rng.randrange(8)
                    frame = bytes(buf)
                    self.link.frames_corrupted += 1
                frames.append(frame)
            seq = (seq + 1) & 0xFF
        self._seq = seq
        if frames:
            data = unsigned = b"".join(frames)
            signing = self.signing if self.signing.enabled else None
            signed: dict[int, bytes] = {}  # per link: its own link id and timestamps, the same bytes to each client
            for c in self.clients:
                t = c.transport
                if t is None:
                    continue
                if t.get_write_buffer_size() > WRITE_BUFFER_LIMIT:
                    self.link.frames_slow_client += len(frames)
                    continue
                if signing is not None:
                    data = signed.get(c.link_id) or b""
                    if not data:
                        data = signed[c.link_id] = b"".join(signing.sign(f, c.link_id) for f in frames)
                else:
                    data = unsigned
                t.write(data)
                self.link.frames_out += len(frames)
                self.link.bytes_out += len(data)
        if self.reboot_pending:
            self._start_reboot()

    def _start_reboot(self) -> None:
        """After the ACK went out: drop every connection and stop listening, as a rebooting SITL does."""
        self.reboot_pending = False
        self.rebooting_until = self._clock() + self.reboot_s
        if self.signing.enabled:
            self.signing.rebooted()
        self.out.clear()
        self._close_clients()
        self._close_listener()


def _type_name(item: Any) -> str:
    if type(item) is tuple:
        packer: Packer = item[0]
        return packer.name
    return str(item.msgname)
