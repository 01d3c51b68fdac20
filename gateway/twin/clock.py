"""The gateway's one clock: the `time` of every state sample and event it publishes.

The wall clock is read once, when the clock is made, and every later reading
is that anchor plus the monotonic clock's progress since. So a time never
jumps (an NTP step or a wrong RTC being set does not move it) and is never
ahead of the moment the gateway received the data, which is what a reader
needs to compute an age: `reader's now - time`. The vehicle's own clock
(its boot time, or UTC mapped through SYSTEM_TIME) is not used for `time`:
a sped-up simulator or an autopilot with a wrong GPS time would make a dead
vehicle's last sample look like it comes from the future (an age of -18 s
was seen). Where it is useful a payload carries the boot time as its own
field, `time_boot_ms`.

Reading it costs one `time.monotonic_ns()` call; the hot path reads it once
per received batch, the ticker once per tick.
"""

from __future__ import annotations

import time


class GatewayClock:
    """UTC nanoseconds since the epoch: wall clock at construction + monotonic delta."""

    __slots__ = ("_anchor_ns",)

    def __init__(self, *, wall_ns: int | None = None, monotonic_ns: int | None = None) -> None:
        wall = time.time_ns() if wall_ns is None else wall_ns
        mono = time.monotonic_ns() if monotonic_ns is None else monotonic_ns
        self._anchor_ns = wall - mono

    def now_ns(self) -> int:
        return self._anchor_ns + time.monotonic_ns()
