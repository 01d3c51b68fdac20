"""The one seam between MAVLink protocol code and a live link.

Protocol runners (commands, missions, parameters) and the gateway depend on
this structural interface, never on a concrete link class, so a fake and the
real driver fit without inheritance.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Protocol

from anyio.streams.memory import MemoryObjectReceiveStream

from mavjet.drivers.mavlink.dialect import MavMessage


class MavPort(Protocol):
    """A live MAVLink link to one vehicle."""

    @property
    def target_system(self) -> int:
        """The vehicle's MAVLink system id."""

    @property
    def target_component(self) -> int:
        """The autopilot's component id (1)."""

    async def send(self, msg: MavMessage) -> None:
        """Encode and send one message; raises mavjet.contract.errors.LinkError when the link is down."""

    def listen(self, max_buffer: int = 256) -> AbstractAsyncContextManager[MemoryObjectReceiveStream[MavMessage]]:
        """Receive every message the vehicle sends while the context is open.

        Bounded: a listener that falls `max_buffer` messages behind loses the
        oldest ones (counted), it never blocks the link's reader.
        """
