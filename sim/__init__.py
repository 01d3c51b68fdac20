"""Simulated vehicles that speak MAVLink 2 like ArduCopter SITL.

`mavjet.sim.fleet.SimFleet` runs N vehicles in the caller's event loop, each behind
its own TCP listener (like SITL's tcp:5760+10*i), so the gateway and its tests
talk to them over real sockets exactly as they would to ArduPilot. The split:

- `mavjet.sim.model` — one vehicle's behaviour, sans-IO: MAVLink messages in,
  MAVLink messages out, time passed in explicitly (its concerns in
  `mavjet.sim.commands`, `control`, `flight`, `failsafe`, `stores`, `telemetry`).
- `mavjet.sim.vehicle` — the vehicle's TCP endpoint, framing, and fault injection.
- `mavjet.sim.fleet` — config, the shared tick loop, start/stop.
- `mavjet.sim.cli` — `mavjet sim ...` as a separate process (load generator, demo).

This package's `__init__` imports nothing heavy: `mavjet.analytics.synth` (synthetic event
history) lives here too and must not pay for the MAVLink dialect.
"""

from __future__ import annotations
