"""The vehicle's parameter names (PARAM_REQUEST_LIST), so an autopilot that does not answer a read of an unknown
name (ArduPilot up to 4.7: no PARAM_VALUE, no PARAM_ERROR) still gets a definite "no such parameter".

`ParamDirectory` is fetched once per connection, lazily: the first time a read or set of a name times out
(`VehicleSession.read_param`), and kept fresh: a new connection, or a PARAM_VALUE whose `param_count` differs from
the list's (parameters appear when a feature is enabled and the vehicle rebooted), makes it stale and the next
miss fetches it again. While fresh, a name it lacks fails at once, without a read.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import anyio

from mavjet.drivers.mavlink.dialect import MavMessage, mavlink2
from mavjet.drivers.mavlink.params import ParamUnknown, decode_param_id
from mavjet.drivers.mavlink.port import MavPort

# PARAM_VALUEs of one list: ArduCopter has ~1,350; the buffer rides out the burst.
_LIST_BUFFER = 8192
_MISSING_PER_ROUND = 200  # indexes asked for again (PARAM_REQUEST_READ by index) per round


class ParamNotListed(ParamUnknown):
    """`name` is not in the vehicle's parameter list (fetched with PARAM_REQUEST_LIST): it has no such parameter."""

    def __init__(self, name: str, count: int, age_s: float) -> None:
        super().__init__(name, 1)
        self.reason = f"the vehicle has no such parameter (not among its {count} listed, fetched {age_s:.0f} s ago)"
        self.args = (f"param {name}: {self.reason}",)


@dataclass(slots=True)
class ParamDirectory:
    """The names of one vehicle's parameters, as its list said, with when and over which connection."""

    names: frozenset[str] = frozenset()
    count: int = 0
    fetched_mono: float | None = None
    connection: int = -1  # the link's connect count when fetched
    stale: bool = True
    lock: anyio.Lock = field(default_factory=anyio.Lock)

    def fresh(self, connection: int) -> bool:
        return not self.stale and self.fetched_mono is not None and connection == self.connection

    def lacks(self, name: str, connection: int) -> ParamNotListed | None:
        """The error for `name` when the fresh list lacks it, else None (unknown list: None too)."""
        if not self.fresh(connection) or name in self.names:
            return None
        assert self.fetched_mono is not None
        return ParamNotListed(name, self.count, time.monotonic() - self.fetched_mono)

    def seen(self, param_count: int) -> None:
        """A PARAM_VALUE's param_count: another count than the list's means the set changed."""
        if self.fetched_mono is not None and param_count > 0 and param_count != self.count:
            self.stale = True

    def store(self, names: frozenset[str], count: int, connection: int) -> None:
        self.names, self.count, self.connection = names, count, connection
        self.fetched_mono, self.stale = time.monotonic(), False


async def fetch_names(port: MavPort, target_system: int, target_component: int, *, silence_s: float = 0.5,
                      rounds: int = 4) -> tuple[frozenset[str], int] | None:
    """PARAM_REQUEST_LIST, then each missing index by PARAM_REQUEST_READ, in at most `rounds` more rounds that
    end on `silence_s` without a PARAM_VALUE. The names and the count, or None when the list stayed incomplete."""
    got: dict[int, str] = {}
    count: int | None = None
    async with port.listen(_LIST_BUFFER) as rx:
        await port.send(mavlink2.MAVLink_param_request_list_message(target_system, target_component))
        for round_no in range(rounds + 1):
            quiet_at = anyio.current_time() + silence_s  # the round ends `silence_s` after its last PARAM_VALUE
            while True:
                msg: MavMessage | None = None
                with anyio.move_on_after(max(0.0, quiet_at - anyio.current_time())):
                    msg = await rx.receive()
                if msg is None:
                    break
                if msg.get_type() != "PARAM_VALUE" or msg.get_srcSystem() != target_system:
                    continue
                quiet_at = anyio.current_time() + silence_s
                count = int(msg.param_count)
                index = int(msg.param_index)
                if 0 <= index < count:
                    got[index] = decode_param_id(msg.param_id)
            if count is not None and len(got) >= count:
                return frozenset(got.values()), count
            if round_no == rounds:
                return None
            if count is None:
                await port.send(mavlink2.MAVLink_param_request_list_message(target_system, target_component))
                continue
            for index in [i for i in range(count) if i not in got][:_MISSING_PER_ROUND]:
                await port.send(mavlink2.MAVLink_param_request_read_message(
                    target_system, target_component, b"", index))
    return None
