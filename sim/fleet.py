"""A fleet of simulated vehicles in the caller's event loop.

    async with SimFleet(SimConfig(vehicles=3, base_port=0, speedup=5.0)) as fleet:
        fleet.endpoints        # ["tcp:127.0.0.1:PORT", ...]
        v = fleet.vehicles[0]  # SimVehicle

One shared tick loop drives every vehicle: each tick advances the sim clock
by `tick_s * speedup`, steps every vehicle to it and writes each vehicle's
frames with one `write()` per client. A task per vehicle (let alone per
stream) would cost a thousand wake-ups a tick at load-test sizes. A large
fleet is stepped in chunks of `TICK_CHUNK` vehicles spread over the tick
(`chunk_slots`), and each vehicle heartbeats at its own instant of the
second (`heartbeat_phase_s`), so its vehicles are out of step as real
autopilots are; `in_step` steps them all at the tick's start and
heartbeats them together.

The tick task is a plain asyncio task started in `start()` and cancelled
and awaited in `stop()`, not an anyio task group held open across
`__aenter__`/`__aexit__`: test fixtures may enter and leave the fleet from
different tasks, which a cancel scope does not allow. A crash of the tick
loop is re-raised by `stop()`.

Sim time runs `speedup` times faster than the wall clock; everything the
vehicles do (telemetry rates, climb rates, timeouts, boot time, the UTC in
SYSTEM_TIME, which starts at the real time) follows sim time, as ArduPilot
SITL's `--speedup` does. Link faults (`drop_link`) and the command
retransmission window are wall-clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Final

from mavjet.contract.errors import ConfigError
from mavjet.sim import geo
from mavjet.sim.encoder import Encoder
from mavjet.sim.model import VehicleOptions
from mavjet.sim.modes import FLAVOURS
from mavjet.sim.sortie import Sortie
from mavjet.sim.vehicle import SimVehicle

log = logging.getLogger(__name__)

# ArduPilot SITL's default location (CMAC, Canberra), ground altitude AMSL
DEFAULT_HOME: Final = (-35.363261, 149.165230, 584.0)


def _probability(key: str, value: float) -> None:
    if not (0.0 <= value <= 1.0):
        raise ConfigError(key, f"must be a probability in [0, 1], got {value}")


TICK_CHUNK: Final = 64  # vehicles stepped between two looks at the sockets


def chunk_slots(vehicles: int, period_s: float, *, in_step: bool) -> list[tuple[int, float]]:
    """When in a tick each chunk of `TICK_CHUNK` vehicles is stepped: (its first vehicle, seconds after the tick's start).

    Out of step (the default), the chunks are spread evenly over the period, so
    a large fleet's vehicles send at many instants of a tick, as independent
    autopilots do (each booted at its own time, each with its own scheduler).
    In step, every chunk is stepped at the tick's start, one after the other:
    the whole fleet sends in one burst per tick, which can flatter a gateway
    that reads in bursts (docs/sim.md).
    """
    firsts = range(0, vehicles, TICK_CHUNK)
    if in_step:
        return [(first, 0.0) for first in firsts]
    return [(first, period_s * i / len(firsts)) for i, first in enumerate(firsts)]


# The golden ratio's fraction: vehicle i's phase is i times this, modulo 1, so any first k vehicles
# of a fleet are spread evenly over the second (a fleet of 3 as well as one of 1,000).
_PHASE_STEP: Final = (math.sqrt(5.0) - 1.0) / 2.0


def heartbeat_phase_s(index: int, *, in_step: bool) -> float:
    """Sim seconds before vehicle `index`'s first HEARTBEAT: out of step, spread over the second, as
    autopilots that booted at their own instants are; in step, all at once (docs/sim.md)."""
    return 0.0 if in_step else (index * _PHASE_STEP) % 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    """How many vehicles, where they listen, how fast time runs, and fleet-wide fault defaults."""

    vehicles: int = 1
    base_port: int = 5760  # vehicle i listens on base_port + port_step*i; 0: any free port
    port_step: int = 10
    host: str = "127.0.0.1"
    speedup: float = 1.0
    flavour: str = "ardupilot"
    sortie: bool = False
    loss: float = 0.0
    corrupt: float = 0.0
    loss_in: float = 0.0
    tick_s: float = 0.05  # wall seconds between ticks
    in_step: bool = False  # every vehicle stepped at the tick's start, heartbeats in one instant; default: spread
    gps_fix_s: float = 1.0  # sim seconds from boot to a 3D fix
    ekf_settle_s: float = 2.0  # sim seconds from boot until the EKF (and pre-arm) is happy
    boot_s: float = 3.0  # ArduPilot: sim seconds in system_status BOOT before "ArduPilot Ready" (SITL: ~3 s)
    reboot_s: float = 1.0  # sim seconds a reboot keeps the vehicle off the air
    home_lat_deg: float = DEFAULT_HOME[0]
    home_lon_deg: float = DEFAULT_HOME[1]
    ground_alt_m: float = DEFAULT_HOME[2]
    spacing_m: float = 10.0  # vehicles start on a grid this far apart
    first_sysid: int = 1
    in_progress_commands: frozenset[int] = field(default_factory=frozenset)
    in_progress_delay_s: float = 1.0
    confirmation_window_s: float = 5.0
    battery_drain_scale: float = 1.0
    seed: int = 0
    terrain_tiles: bool = False  # every vehicle holds terrain files for its area (TERRAIN_REPORT healthy)

    def __post_init__(self) -> None:
        if not 1 <= self.vehicles <= 10_000:
            raise ConfigError("vehicles", f"must be 1..10000, got {self.vehicles}")
        if self.base_port != 0:
            last = self.base_port + self.port_step * (self.vehicles - 1)
            if not 1 <= self.base_port <= 65535 or last > 65535:
                raise ConfigError("base_port", f"ports {self.base_port}..{last} do not fit in 1..65535")
            if self.port_step < 1:
                raise ConfigError("port_step", "must be >= 1")
        if not (math.isfinite(self.speedup) and 0 < self.speedup <= 1000):
            raise ConfigError("speedup", f"must be in (0, 1000], got {self.speedup}")
        if self.flavour not in FLAVOURS:
            raise ConfigError("flavour", f"must be one of {sorted(FLAVOURS)}, got {self.flavour!r}")
        _probability("loss", self.loss)
        _probability("corrupt", self.corrupt)
        _probability("loss_in", self.loss_in)
        if not 0.001 <= self.tick_s <= 1.0:
            raise ConfigError("tick_s", f"must be in [0.001, 1], got {self.tick_s}")
        for key in ("gps_fix_s", "ekf_settle_s", "boot_s", "reboot_s", "in_progress_delay_s", "confirmation_window_s"):
            v = getattr(self, key)
            if not (math.isfinite(v) and v >= 0):
                raise ConfigError(key, f"must be >= 0, got {v}")
        if not -90 <= self.home_lat_deg <= 90 or not -180 <= self.home_lon_deg <= 180:
            raise ConfigError("home_lat_deg", "home must be a valid latitude/longitude")
        if not 1 <= self.first_sysid <= 255:
            raise ConfigError("first_sysid", f"must be 1..255, got {self.first_sysid}")
        if self.battery_drain_scale < 0:
            raise ConfigError("battery_drain_scale", "must be >= 0")

    def sysid(self, index: int) -> int:
        """MAVLink system ids are 1..255: fleets larger than that reuse them (each vehicle has its own port)."""
        return (self.first_sysid - 1 + index) % 255 + 1

    def port(self, index: int) -> int:
        return 0 if self.base_port == 0 else self.base_port + self.port_step * index


@dataclass(slots=True)
class FleetStats:
    ticks: int = 0
    overruns: int = 0  # ticks that started late by more than one tick period
    busy_s: float = 0.0  # wall time spent inside ticks


class SimFleet:
    """Runs `config.vehicles` vehicles until `stop()` (or the end of `async with`)."""

    def __init__(self, config: SimConfig | None = None) -> None:
        self.config = config or SimConfig()
        self.vehicles: list[SimVehicle] = []
        self.stats = FleetStats()
        self._t0 = 0.0
        self._epoch = 0.0
        self._task: asyncio.Task[None] | None = None
        self._encoder = Encoder()

    # ------------------------------------------------------------------ clock
    def sim_time(self) -> float:
        """Sim seconds since the fleet started."""
        return (time.monotonic() - self._t0) * self.config.speedup

    @property
    def endpoints(self) -> list[str]:
        return [v.endpoint for v in self.vehicles]

    def vehicle(self, sysid: int) -> SimVehicle:
        for v in self.vehicles:
            if v.sysid == sysid:
                return v
        raise KeyError(sysid)

    # ------------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> SimFleet:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop(raise_errors=exc is None)

    async def start(self) -> None:
        cfg = self.config
        self._t0 = time.monotonic()
        self._epoch = time.time()
        flavour = FLAVOURS[cfg.flavour]
        side = max(1, math.ceil(math.sqrt(cfg.vehicles)))
        try:
            for i in range(cfg.vehicles):
                north, east = (i // side) * cfg.spacing_m, (i % side) * cfg.spacing_m
                lat, lon = geo.offset(cfg.home_lat_deg, cfg.home_lon_deg, north, east)
                opts = VehicleOptions(
                    sysid=cfg.sysid(i),
                    flavour=flavour,
                    lat_deg=lat,
                    lon_deg=lon,
                    ground_amsl_m=cfg.ground_alt_m,
                    heading_deg=(353.0 + 7.0 * i) % 360.0,
                    epoch_unix_s=self._epoch,
                    gps_fix_s=cfg.gps_fix_s,
                    ekf_settle_s=cfg.ekf_settle_s,
                    boot_s=cfg.boot_s,
                    in_progress_commands=cfg.in_progress_commands,
                    in_progress_delay_s=cfg.in_progress_delay_s,
                    confirmation_window_s=cfg.confirmation_window_s,
                    battery_drain_scale=cfg.battery_drain_scale,
                    seed=cfg.seed * 100_003 + i,
                    terrain_preloaded=cfg.terrain_tiles,
                    heartbeat_phase_s=heartbeat_phase_s(i, in_step=cfg.in_step),
                )
                v = SimVehicle(
                    opts,
                    host=cfg.host,
                    port=cfg.port(i),
                    clock=self.sim_time,
                    encoder=self._encoder,
                    reboot_s=cfg.reboot_s,
                    loss=cfg.loss,
                    corrupt=cfg.corrupt,
                    loss_in=cfg.loss_in,
                )
                if cfg.sortie:
                    v.sortie = Sortie(index=i, seed=opts.seed)
                await v.listen()
                self.vehicles.append(v)
        except BaseException:
            await self._close_all()
            raise
        self._task = asyncio.create_task(self._run(), name="sim-fleet-tick")

    async def stop(self, *, raise_errors: bool = True) -> None:
        task, self._task = self._task, None
        error: BaseException | None = None
        if task is not None:
            if task.done():
                error = None if task.cancelled() else task.exception()
            else:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self._close_all()
        if error is not None and raise_errors:
            raise error

    async def _close_all(self) -> None:
        for v in self.vehicles:
            await v.close()

    # ------------------------------------------------------------------ the tick loop
    async def _run(self) -> None:
        period = self.config.tick_s
        speedup = self.config.speedup
        vehicles = self.vehicles  # the fleet is complete before this task starts
        slots = chunk_slots(len(vehicles), period, in_step=self.config.in_step)
        next_tick = time.monotonic()
        stats = self.stats
        while True:
            start = time.monotonic()
            busy = 0.0
            for first, offset_s in slots:
                # Between chunks the loop reads the sockets: a tick of a large fleet takes tens of
                # ms, and a command frame waiting that long for its vehicle would be the simulator's
                # latency, not the autopilot's (ArduPilot answers within a loop of its own, ~2.5 ms).
                if first:
                    await asyncio.sleep(max(0.0, start + offset_s - time.monotonic()))
                wall = time.monotonic()
                sim_now = (wall - self._t0) * speedup
                for v in vehicles[first : first + TICK_CHUNK]:
                    v.tick(sim_now, wall)
                busy += time.monotonic() - wall
            wall = time.monotonic()
            sim_now = (wall - self._t0) * speedup
            for v in vehicles:
                if v.needs_service(sim_now, wall):
                    await v.service(sim_now, wall)
            done = time.monotonic()
            stats.ticks += 1
            stats.busy_s += busy + (done - wall)
            next_tick += period
            delay = next_tick - done
            if delay < -period:
                stats.overruns += 1
                next_tick = done
                delay = 0.0
            await asyncio.sleep(max(delay, 0.0))
