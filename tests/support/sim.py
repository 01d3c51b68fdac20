"""The simulator tests' helpers: a fleet on free loopback ports and a MAVLink client.

The client is deliberately independent of `drivers/`: it is pymavlink over
an asyncio TCP connection, the way any ground station would talk to SITL,
so these tests check the simulator against MAVLink itself and not against
our own gateway code.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from pymavlink.dialects.v20 import ardupilotmega as mavlink2

from mavjet.sim.fleet import SimConfig, SimFleet
from tests.support.wait import wait_for

M = mavlink2


class MavClient:
    """A minimal ground station: records every message, sends what it is told."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, sysid: int = 255, compid: int = 190) -> None:
        self.reader = reader
        self.writer = writer
        self.mav = M.MAVLink(None, sysid, compid)
        self.mav.robust_parsing = True
        self.messages: list[Any] = []
        self.bad = 0
        self.closed = False
        self._new = asyncio.Event()
        self._task = asyncio.create_task(self._read())

    @classmethod
    async def connect(cls, endpoint: str, **kw: Any) -> MavClient:
        _, host, port = endpoint.split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        return cls(reader, writer, **kw)

    async def _read(self) -> None:
        try:
            while True:
                data = await self.reader.read(65536)
                if not data:
                    break
                for msg in self.mav.parse_buffer(data) or ():
                    if msg.get_type() == "BAD_DATA":
                        self.bad += 1
                    else:
                        self.messages.append(msg)
                self._new.set()
        except (ConnectionError, OSError):
            pass
        finally:
            self.closed = True
            self._new.set()

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()

    def send(self, msg: Any) -> None:
        self.writer.write(msg.pack(self.mav))
        self.mav.seq = (self.mav.seq + 1) % 256

    def mark(self) -> int:
        return len(self.messages)

    def of(self, mtype: str, since: int = 0) -> list[Any]:
        return [m for m in self.messages[since:] if m.get_type() == mtype]

    async def recv(
        self, mtype: str, pred: Callable[[Any], bool] | None = None, *, since: int | None = None, timeout_s: float = 5.0
    ) -> Any:
        """The first `mtype` message (after index `since`, default: from now) matching `pred`."""
        i = self.mark() if since is None else since
        async with asyncio.timeout(timeout_s):
            while True:
                while i < len(self.messages):
                    m = self.messages[i]
                    i += 1
                    if m.get_type() == mtype and (pred is None or pred(m)):
                        return m
                if self.closed:
                    raise ConnectionError("vehicle closed the connection")
                self._new.clear()
                await self._new.wait()

    async def wait_closed(self, timeout_s: float = 5.0) -> None:
        async with asyncio.timeout(timeout_s):
            while not self.closed:
                self._new.clear()
                await self._new.wait()

    async def command_long(
        self, target: int, cmd: int, *params: float, confirmation: int = 0, final: bool = True, timeout_s: float = 5.0
    ) -> Any:
        """Send COMMAND_LONG and return its ACK (the final one unless `final=False`)."""
        p = [*params, *([0.0] * (7 - len(params)))]
        i = self.mark()
        self.send(M.MAVLink_command_long_message(target, 1, cmd, confirmation, *p))
        return await self.recv(
            "COMMAND_ACK",
            lambda a: a.command == cmd and (not final or a.result != M.MAV_RESULT_IN_PROGRESS),
            since=i,
            timeout_s=timeout_s,
        )

    async def command_int(
        self, target: int, cmd: int, frame: int, p1: float, p2: float, p3: float, p4: float, x: int, y: int, z: float,
        timeout_s: float = 5.0,
    ) -> Any:  # fmt: skip
        i = self.mark()
        self.send(M.MAVLink_command_int_message(target, 1, frame, cmd, 0, 0, p1, p2, p3, p4, x, y, z))
        return await self.recv("COMMAND_ACK", lambda a: a.command == cmd and a.result != M.MAV_RESULT_IN_PROGRESS, since=i, timeout_s=timeout_s)

    async def set_mode(self, target: int, custom_mode: float, sub: float = 0) -> Any:
        return await self.command_long(target, M.MAV_CMD_DO_SET_MODE, M.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED, custom_mode, sub)


@contextlib.asynccontextmanager
async def running(**kw: Any) -> AsyncIterator[SimFleet]:
    cfg = {"vehicles": 1, "base_port": 0, "speedup": 10.0, "tick_s": 0.02, **kw}
    async with SimFleet(SimConfig(**cfg)) as fleet:
        yield fleet
        for v in fleet.vehicles:
            assert v.stats.handler_errors == 0, "the vehicle raised while handling input"


async def ready(fleet: SimFleet, index: int = 0) -> None:
    """Wait until the vehicle's GPS and EKF are happy (arming possible)."""
    await wait_for(lambda: fleet.vehicles[index].position_ok, timeout_s=10, interval_s=0.02)


async def airborne(fleet: SimFleet, gcs: MavClient, alt_m: float = 10.0) -> None:
    """GUIDED, armed, climbed to `alt_m`."""
    v = fleet.vehicles[0]
    await ready(fleet)
    assert (await gcs.set_mode(v.sysid, 4)).result == M.MAV_RESULT_ACCEPTED
    assert (await gcs.command_long(v.sysid, M.MAV_CMD_COMPONENT_ARM_DISARM, 1)).result == M.MAV_RESULT_ACCEPTED
    assert (await gcs.command_long(v.sysid, M.MAV_CMD_NAV_TAKEOFF, 0, 0, 0, 0, 0, 0, alt_m)).result == M.MAV_RESULT_ACCEPTED
    await wait_for(lambda: v.alt_m >= alt_m - 0.1 and v.takeoff_alt_m is None, timeout_s=15, interval_s=0.02)


__all__ = ["M", "MavClient", "airborne", "ready", "running"]
