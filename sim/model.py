"""One simulated ArduCopter (or PX4 vehicle), sans-IO: MAVLink messages in, MAVLink messages out.

`VehicleModel` is the vehicle's state (`mavjet.sim.state.VehicleState`, a
dataclass) plus its entry points: `handle(msg, partner, now, wall)` reacts
to one decoded message; `step(now)` advances flight, battery, failsafes,
missions and telemetry to sim time `now`; the flight API (`arm`, `set_mode`,
`takeoff`, `goto`, ...) and fault injection (`reject_next`,
`set_battery_pct`) are what the built-in sortie and tests call. Everything
the vehicle says is in the state's outbox `out`, either as a pymavlink
message or, for hot telemetry, as `(Packer, values)` so the I/O layer can
frame it cheaply. No sockets, no asyncio, no clocks read: time is passed in
(sim seconds since the fleet started; `wall` is the monotonic clock, used
only for the link-level retransmission window).

What it imitates is what a gateway relies on: ArduCopter's mode numbers and
mode-entry rules, pre-arm checks, command results (the same MAV_RESULT
ArduPilot returns for the same mistake), the mission protocol with home at
seq 0, parameters, battery and fence failsafes. Kinematics are deliberately
simple: straight lines at a constant speed, no wind, no acceleration.

The behaviour is in step modules by concern, functions over the state
(docs in `mavjet.sim`'s `__init__`); this class only dispatches to them, so
it is the one module that imports them all.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Final

from mavjet.sim import commands, control, flight, health, lifecycle, stores, telemetry
from mavjet.sim.consts import FORCEABLE, IN_PROGRESS
from mavjet.sim.state import ExecutedCommand, Stats, VehicleOptions, VehicleState, text

__all__ = ["ExecutedCommand", "Stats", "VehicleModel", "VehicleOptions"]

MAX_DT: Final = 0.1  # physics and telemetry resolution, sim seconds


class VehicleModel(VehicleState):
    """Flight state, autopilot logic and telemetry of one simulated vehicle."""

    def __init__(self, opts: VehicleOptions) -> None:
        super().__init__(opts)
        lifecycle.power_on(self, 0.0)
        self.schedule.reset(opts.heartbeat_phase_s)  # the first HEARTBEAT at this vehicle's phase

    def reboot_now(self, now: float) -> None:
        """Come back from a reboot (the I/O layer calls this once the downtime is over)."""
        self.reboots += 1
        lifecycle.power_on(self, now)

    # ------------------------------------------------------------------ fault injection
    def set_battery_pct(self, pct: float) -> None:
        """Fault injection: jump the remaining charge (failsafes follow on the next step)."""
        pct = max(0.0, min(100.0, pct))
        self.consumed_mah = self.capacity_mah * (1.0 - pct / 100.0)
        if self.battery_fs and not health.battery_level(self):
            self.battery_fs = 0  # a fresh battery clears the failsafe
        self.next_battery_check = self.now

    def reject_next(self, command: int, result: int, count: int = 1) -> None:
        """Fault injection: answer the next `count` new `command`s with `result` without executing them.

        Each is recorded in `executions` with `executed=False`. Its
        retransmissions (confirmation > 0, same params) get the same answer
        without using up another of the `count`, like any command the
        vehicle already answered. Calls add up, in order; a reboot keeps them.
        """
        if result == IN_PROGRESS or result not in FORCEABLE:
            raise ValueError(f"reject_next: result must be a final MAV_RESULT (not IN_PROGRESS), got {result}")
        if count < 1:
            raise ValueError(f"reject_next: count must be at least 1, got {count}")
        self.desk.forced.setdefault(int(command), deque()).extend([int(result)] * count)

    def forced_pending(self, command: int) -> int:
        """How many forced results `reject_next` still holds for `command`."""
        return len(self.desk.forced.get(int(command), ()))

    # ------------------------------------------------------------------ flight API (also used by the sortie)
    def arm(self, *, force: bool = False) -> int:
        """Arm as a COMPONENT_ARM_DISARM would (`force`: skip the pre-arm checks); returns the MAV_RESULT."""
        return control.arm(self, force=force)

    def disarm(self, *, force: bool = False) -> int:
        return control.disarm(self, force=force)

    def set_mode(self, name: str, *, reason: str = "gcs") -> int:
        """Switch to the flavour's mode `name` under the flavour's mode-entry rules."""
        return control.set_mode(self, name, reason=reason)

    def takeoff(self, alt_m: float) -> int:
        return control.takeoff(self, alt_m)

    def goto(self, lat_deg: float, lon_deg: float, alt_m: float) -> int:
        return control.goto(self, lat_deg, lon_deg, alt_m)

    # ------------------------------------------------------------------ stand-ins for tests outside sim/
    def _text(self, severity: int, txt: str) -> None:
        """A STATUSTEXT now (gateway tests use it to stand for the autopilot's own)."""
        text(self, severity, txt)

    def _send_param(self, idx: int, wire_index: int | None = None) -> None:
        """A PARAM_VALUE for param `idx` (tests use it to stand for a change made on another link)."""
        telemetry.send_param(self, idx, wire_index)

    def _reached(self, seq: int) -> None:
        """A MISSION_ITEM_REACHED for `seq` (tests use it to stand for the AUTO mission)."""
        flight.report_reached(self, seq)

    # ------------------------------------------------------------------ input
    def handle(self, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
        """React to one decoded message from `partner` (sysid, compid)."""
        self.stats.frames_in += 1
        mtype = msg.get_type()
        handler = _HANDLERS.get(mtype)
        if handler is None:
            if mtype == "BAD_DATA":
                self.stats.bad_frames_in += 1
            return
        target = getattr(msg, "target_system", 0)
        if target not in (0, self.sysid):
            return
        handler(self, msg, partner, now, wall)

    # ------------------------------------------------------------------ time
    def step(self, now: float) -> None:
        """Advance to sim time `now` in steps of at most MAX_DT, emitting telemetry as it falls due."""
        while self.now < now - 1e-9:
            dt = min(MAX_DT, now - self.now)
            self.now += dt
            flight.physics(self, dt)
            lifecycle.checks(self)
            if self.sortie is not None and not self.external_control:
                self.sortie.step(self, self.now)
            if self.desk.pending:
                commands.poll_pending(self, self.now)
            if self.missions.upload is not None:
                self.out.extend(self.missions.poll(self.now))
            if self.now >= self.schedule.next_due:
                for msg_id in self.schedule.due(self.now):
                    telemetry.emit(self, msg_id)
        if self.logs.active:  # a log transfer streams a burst per tick (paused while armed)
            self.out.extend(self.logs.poll(armed=self.armed))
        commands.flush_after_ack(self)  # an arm refused outside a command (the built-in sortie)


_HANDLERS: Final[dict[str, Any]] = {
    "HEARTBEAT": telemetry.on_heartbeat,
    "TIMESYNC": telemetry.on_timesync,
    "REQUEST_DATA_STREAM": telemetry.on_request_data_stream,
    "SET_MODE": commands.on_set_mode,
    "COMMAND_LONG": commands.on_command_long,
    "COMMAND_INT": commands.on_command_int,
    "PARAM_REQUEST_LIST": stores.on_param_request_list,
    "PARAM_REQUEST_READ": stores.on_param_request_read,
    "PARAM_SET": stores.on_param_set,
    "MISSION_COUNT": stores.on_mission_count,
    "MISSION_ITEM_INT": stores.on_mission_item,
    "MISSION_ITEM": stores.on_mission_item,
    "MISSION_REQUEST_LIST": stores.on_mission_request_list,
    "MISSION_REQUEST_INT": stores.on_mission_request,
    "MISSION_REQUEST": stores.on_mission_request,
    "MISSION_CLEAR_ALL": stores.on_mission_clear_all,
    "MISSION_SET_CURRENT": stores.on_mission_set_current,
    "MISSION_ACK": stores.on_mission_ack,
    "TERRAIN_DATA": stores.on_terrain_data,
    "TERRAIN_CHECK": stores.on_terrain_check,
    "LOG_REQUEST_LIST": stores.on_log_message,
    "LOG_REQUEST_DATA": stores.on_log_message,
    "LOG_REQUEST_END": stores.on_log_message,
}
