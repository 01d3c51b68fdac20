"""`mavjet sim`: simulated vehicles as a separate process.

    mavjet sim --vehicles 3 [--base-port 5760] [--speedup 5] [--sortie] [--loss 0.01]
    mavjet sim bench ...    (how many vehicles this sim sustains, see mavjet.sim.bench)

Prints one line per vehicle once it listens (`vehicle sysid=1
endpoint=tcp:127.0.0.1:5760`), then `ready vehicles=N`, so a parent process
can wait for the last line; a simulator whose tick path is compiled
(`mavjet compile --target DIR --sim`) says how many of its modules are:
`ready vehicles=N compiled=K`. Runs until SIGTERM or SIGINT and exits 0.
`--stats S` prints a JSON line of load figures to stderr every S seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import time

from pymavlink.dialects.v20 import ardupilotmega as mavlink2

from mavjet.contract.errors import ConfigError, LinkError
from mavjet.sim.fleet import SimConfig, SimFleet
from mavjet.sim.readyline import compiled_from_ready, compiled_modules
from mavjet.sim.stepmode import IN_STEP_ENV, in_step_from_env

# `compiled_from_ready` stays importable from here: the benchmarks read the ready line through it.
__all__ = ["build_parser", "compiled_from_ready", "compiled_modules", "config_from_args", "main", "run"]

_IN_PROGRESS_NAMES = {
    "takeoff": mavlink2.MAV_CMD_NAV_TAKEOFF,
    "reposition": mavlink2.MAV_CMD_DO_REPOSITION,
    "land": mavlink2.MAV_CMD_NAV_LAND,
    "rtl": mavlink2.MAV_CMD_NAV_RETURN_TO_LAUNCH,
    "mission_start": mavlink2.MAV_CMD_MISSION_START,
    "arm": mavlink2.MAV_CMD_COMPONENT_ARM_DISARM,
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mavjet sim", description="Run simulated vehicles that speak MAVLink like ArduPilot SITL.")
    p.add_argument("--vehicles", "-n", type=int, default=1, help="number of vehicles (default 1)")
    p.add_argument("--base-port", type=int, default=5760, help="vehicle i listens on base-port + port-step*i; 0 = any free port")
    p.add_argument("--port-step", type=int, default=10, help="port distance between vehicles (default 10, like SITL)")
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.add_argument("--speedup", type=float, default=1.0, help="sim time runs this many times faster than wall time")
    p.add_argument("--flavour", choices=["ardupilot", "px4"], default="ardupilot",
                   help="behave like ArduPilot or PX4 on MAVLink (default %(default)s)")
    p.add_argument("--sortie", action="store_true", help="every vehicle flies the built-in sortie on its own, repeatedly")
    p.add_argument("--loss", type=float, default=0.0, help="probability of dropping each outgoing frame")
    p.add_argument("--corrupt", type=float, default=0.0, help="probability of flipping a bit in each outgoing frame")
    p.add_argument("--loss-in", type=float, default=0.0, help="probability of ignoring each incoming frame")
    p.add_argument("--gps-fix-s", type=float, default=1.0, help="sim seconds from boot to a 3D GPS fix")
    p.add_argument("--ekf-settle-s", type=float, default=2.0, help="sim seconds from boot until pre-arm checks pass")
    p.add_argument("--boot-s", type=float, default=3.0, help="ArduPilot: sim seconds in BOOT before STANDBY (SITL: ~3)")
    p.add_argument("--in-progress", action="append", default=[], choices=sorted(_IN_PROGRESS_NAMES),
                   help="answer this command MAV_RESULT_IN_PROGRESS first (repeatable)")  # fmt: skip
    p.add_argument("--tick-ms", type=float, default=50.0, help="wall milliseconds between simulation ticks")
    p.add_argument("--in-step", action="store_true", default=in_step_from_env(),
                   help="step every vehicle at the tick's start and heartbeat them all at the same instant of the "
                        "second, so the whole fleet sends in one burst a tick (default: out of step, spread over the "
                        f"tick and the second, as real autopilots are; env {IN_STEP_ENV}=1)")
    p.add_argument("--battery-drain", type=float, default=1.0, help="battery drain multiplier")
    p.add_argument("--seed", type=int, default=0, help="random seed for --loss, --corrupt, --loss-in and sorties (default %(default)s)")
    p.add_argument("--terrain-tiles", action="store_true",
                   help="vehicles hold terrain files for their area (ArduPilot: TERRAIN_REPORT healthy, no TERRAIN_REQUEST)")
    p.add_argument("--stats", type=float, default=0.0, metavar="S", help="print load figures to stderr every S seconds")
    return p


def config_from_args(args: argparse.Namespace) -> SimConfig:
    return SimConfig(
        vehicles=args.vehicles,
        base_port=args.base_port,
        port_step=args.port_step,
        host=args.host,
        speedup=args.speedup,
        flavour=args.flavour,
        sortie=args.sortie,
        loss=args.loss,
        corrupt=args.corrupt,
        loss_in=args.loss_in,
        gps_fix_s=args.gps_fix_s,
        ekf_settle_s=args.ekf_settle_s,
        boot_s=args.boot_s,
        in_progress_commands=frozenset(_IN_PROGRESS_NAMES[n] for n in args.in_progress),
        tick_s=args.tick_ms / 1000.0,
        in_step=args.in_step,
        battery_drain_scale=args.battery_drain,
        seed=args.seed,
        terrain_tiles=args.terrain_tiles,
    )


async def run(config: SimConfig, *, stats_every_s: float = 0.0) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with SimFleet(config) as fleet:
            for v in fleet.vehicles:
                print(f"vehicle sysid={v.sysid} endpoint={v.endpoint}")
            compiled = compiled_modules()
            print(f"ready vehicles={len(fleet.vehicles)}" + (f" compiled={compiled}" if compiled else ""), flush=True)
            if stats_every_s > 0:
                await _report_until(fleet, stop, stats_every_s)
            else:
                await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    return 0


async def _report_until(fleet: SimFleet, stop: asyncio.Event, every_s: float) -> None:
    last_wall, last_cpu = time.monotonic(), time.process_time()
    last_frames, last_ticks, last_busy = 0, fleet.stats.ticks, fleet.stats.busy_s
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), every_s)
        except TimeoutError:
            pass
        wall, cpu = time.monotonic(), time.process_time()
        frames = sum(v.link.frames_out for v in fleet.vehicles)
        s = fleet.stats
        dt = max(wall - last_wall, 1e-9)
        line = {
            "t": round(wall, 3),
            "frames_out": frames,
            "bytes_out": sum(v.link.bytes_out for v in fleet.vehicles),
            "vehicles": len(fleet.vehicles),
            "clients": sum(len(v.clients) for v in fleet.vehicles),
            "frames_out_per_s": round((frames - last_frames) / dt, 1),
            "cpu_pct": round(100.0 * (cpu - last_cpu) / dt, 1),
            "tick_busy_pct": round(100.0 * (s.busy_s - last_busy) / dt, 1),
            "ticks_per_s": round((s.ticks - last_ticks) / dt, 1),
            "overruns": s.overruns,
            "slow_client_drops": sum(v.link.frames_slow_client for v in fleet.vehicles),
        }
        print(json.dumps(line), file=sys.stderr, flush=True)
        last_wall, last_cpu, last_frames, last_ticks, last_busy = wall, cpu, frames, s.ticks, s.busy_s


def main(argv: list[str]) -> int:
    if argv and argv[0] == "audit":
        print("mavjet sim audit: moved to `mavjet synth` (same options)", file=sys.stderr)
        return 2
    if argv and argv[0] == "bench":
        from mavjet.sim import bench

        rc_bench: int = bench.main(argv[1:])
        return rc_bench
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        config = config_from_args(args)
        return asyncio.run(run(config, stats_every_s=args.stats))
    except ConfigError as exc:
        print(f"mavjet sim: {exc}", file=sys.stderr)
        return 2
    except LinkError as exc:
        print(f"mavjet sim: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
