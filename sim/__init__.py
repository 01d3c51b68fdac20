"""Simulated vehicles that speak MAVLink 2 like ArduCopter SITL (or PX4).

`mavjet.sim.fleet.SimFleet` runs N vehicles in the caller's event loop, each behind
its own TCP listener (like SITL's tcp:5760+10*i), so the gateway and its tests
talk to them over real sockets exactly as they would to ArduPilot.

One vehicle is a sans-IO model: explicit state, step functions over it, and
a thin I/O shell around them. From the bottom up (a module imports only
modules below it; tests/sim/test_structure.py fails on an import cycle):

- Building blocks with no vehicle in them: `consts`, `geo`, `modes` (the
  flavours' mode tables), `params` (the parameter table), `streams` (when each
  telemetry stream is due), `encoder` (framing), and the protocol servers
  `missions` (with `missionitem`, `px4form`), `terrain`, `logs`, `signing`.
- `state`: `VehicleState`, the dataclass of everything one vehicle knows
  (position, mode, arming, mission cursor, failsafes, timers, its stores),
  with the concerns that have state of their own in their own dataclasses
  (`CommandDesk`, `FenceState`, `Stats`), read-only queries (battery, landed
  state, the mission as flown) and its outbox: `out`, the messages to send,
  and `reboot_pending`. Every field is public: the steps of several concerns
  share them, and nothing outside a module reaches into its privates (sim/
  is clean under ruff's SLF001).
- The steps, functions `(state, inputs) -> None` that change the state and
  append their effects to its outbox, by concern: `health` (pure verdicts:
  battery level, fence breach, pre-arm failure), `telemetry` (streams,
  HEARTBEAT, home, PARAM_VALUE), `flight` (kinematics, landing, RTL, AUTO),
  `control` (arming and modes), `failsafe` (battery and fence actions),
  `lifecycle` (power-on and the periodic checks), `stores` (params, mission
  lists, terrain, logs) and `commands` (COMMAND_LONG/INT, SET_MODE).
- `model`: `VehicleModel`, the state with its entry points: `handle(msg, ...)`
  dispatches a message to its step, `step(now)` advances time in physics
  steps, and the flight API and fault injection the sortie and tests call.
  No sockets, no clocks: time is an argument.

The shell: `vehicle` (`SimVehicle`: the TCP endpoint, parsing, framing the
outbox, fault injection, reboots), `fleet` (config, the one shared tick
loop, start/stop), `sortie` (the built-in flight a demo shows), `cli`
(`mavjet sim ...` as a separate process), `bench` (`mavjet sim bench`),
`readyline`, `stepmode`. The tick path (state, the steps it calls, the
model, framing, the vehicle) is what `mavjet compile --sim` compiles
(`mavjet.ops.compile.SIM_MODULES`); a refactoring must keep the bytes
the scenarios of tests/sim/golden.py produce.

This package's `__init__` imports nothing heavy: `mavjet.analytics.synth` (synthetic event
history) lives here too and must not pay for the MAVLink dialect.
"""

from __future__ import annotations
