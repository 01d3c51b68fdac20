"""One simulated ArduCopter (or PX4 vehicle), sans-IO: MAVLink messages in, MAVLink messages out.

`VehicleModel.handle(msg, partner, now, wall)` reacts to one decoded message;
`step(now)` advances flight, battery, failsafes, missions and telemetry to
sim time `now`. Everything the vehicle says is appended to `out`, either as
a pymavlink message object or, for hot telemetry, as `(Packer, values)` so
the I/O layer can frame it cheaply. No sockets, no asyncio, no clocks read:
time is passed in (sim seconds since the fleet started; `wall` is the
monotonic clock, used only for the link-level retransmission window).

What it imitates is what a gateway relies on: ArduCopter's mode numbers and
mode-entry rules, pre-arm checks, command results (the same MAV_RESULT
ArduPilot returns for the same mistake), the mission protocol with home at
seq 0, parameters, battery and fence failsafes. Kinematics are deliberately
simple: straight lines at a constant speed, no wind, no acceleration.

The class keeps the vehicle's state, boot, public API and message dispatch;
each concern is a module of functions over the model (`v: VehicleModel`):
`mavjet.sim.commands` (COMMAND_LONG/INT, SET_MODE: retransmissions, forced and
IN_PROGRESS results, one function per MAV_CMD), `mavjet.sim.control` (arming,
modes, periodic checks), `mavjet.sim.flight` (kinematics, RTL, AUTO),
`mavjet.sim.failsafe` (battery, fence), `mavjet.sim.stores` (params, mission lists,
terrain data, logs) and `mavjet.sim.telemetry` (streams, HEARTBEAT, home).
Functions rather than mixins: the concerns call each other all the time
(a command arms, changes mode, moves the mission cursor, sends telemetry),
and strict mypy cannot type a mixin's `self` as the class that combines it,
while it checks a function over `VehicleModel` attribute by attribute.
Underscored attributes are state shared by those modules, not by other packages.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final

from mavjet.sim import commands, control, failsafe, flight, params, stores, streams, telemetry
from mavjet.sim.commands import ExecutedCommand, Pending, Sent
from mavjet.sim.consts import FORCEABLE, IN_PROGRESS, PREARM_DISPLAY_S, TIMESYNC_S, R
from mavjet.sim.failsafe import FenceState
from mavjet.sim.logs import LogServer, default_logs
from mavjet.sim.missions import FENCE, MISSION, MissionServer, SimMissionItem
from mavjet.sim.modes import Mode, SimFlavour
from mavjet.sim.terrain import TerrainServer

__all__ = ["ExecutedCommand", "Stats", "VehicleModel", "VehicleOptions"]

MAX_DT: Final = 0.1  # physics and telemetry resolution, sim seconds
COMP_AUTOPILOT: Final = 1

ON_GROUND: Final[int] = R.MAV_LANDED_STATE_ON_GROUND
IN_AIR: Final[int] = R.MAV_LANDED_STATE_IN_AIR
TAKEOFF: Final[int] = R.MAV_LANDED_STATE_TAKEOFF
LANDING: Final[int] = R.MAV_LANDED_STATE_LANDING


@dataclass(frozen=True, slots=True, kw_only=True)
class VehicleOptions:
    """Per-vehicle settings the fleet derives from `SimConfig`."""

    sysid: int
    flavour: SimFlavour
    lat_deg: float
    lon_deg: float
    ground_amsl_m: float
    heading_deg: float = 0.0
    epoch_unix_s: float = 0.0  # UTC at sim time 0
    gps_fix_s: float = 1.0
    ekf_settle_s: float = 2.0
    in_progress_commands: frozenset[int] = frozenset()
    in_progress_delay_s: float = 1.0
    confirmation_window_s: float = 5.0
    battery_drain_scale: float = 1.0
    seed: int = 0
    terrain_preloaded: bool = False  # terrain files for the area on the "SD card" (sim/terrain.py)
    boot_s: float = 3.0  # ArduPilot: sim seconds in BOOT before "ArduPilot Ready" / STANDBY (SITL: ~3 s)
    # Sim seconds before the first HEARTBEAT: where in the second this vehicle's scheduler runs.
    # A fleet's autopilots booted at different instants, so their heartbeats (and the streams a
    # ground station starts on hearing one) are spread over the second, not sent in one burst.
    heartbeat_phase_s: float = 0.0


@dataclass(slots=True)
class Stats:
    frames_in: int = 0
    bad_frames_in: int = 0
    commands: int = 0
    retransmits_recognised: int = 0
    unknown_commands: int = 0
    forced_results: int = 0  # commands answered by `reject_next` instead of being executed
    handler_errors: int = 0
    extra: dict[str, int] = field(default_factory=dict)


class VehicleModel:
    """Flight state, autopilot logic and telemetry of one simulated vehicle."""

    def __init__(self, opts: VehicleOptions) -> None:
        self.opts = opts
        self.flavour = opts.flavour
        self.sysid = opts.sysid
        self.compid = COMP_AUTOPILOT
        self.params: dict[str, float] = params.defaults(opts.sysid)
        self.missions = MissionServer(ardupilot=opts.flavour.name == "ardupilot")
        self.terrain = TerrainServer(preloaded=opts.terrain_preloaded, ground_amsl_m=opts.ground_amsl_m)
        # The terrain cache's 1 Hz work runs once terrain is asked about (a stream, a TERRAIN_CHECK, mission
        # points): nothing is visible before that, and a load test's fleet does not pay for it.
        self._terrain_in_use = opts.terrain_preloaded
        self._terrain_required = False  # the mission holds terrain-frame items (set when a mission is committed)
        self.logs = LogServer(partial(default_logs, opts.sysid))  # dataflash logs served by the log protocol
        # ArduPilot sends a stream's messages of one interval together; PX4 times each on its own.
        self.schedule = streams.Schedule(bucketed=opts.flavour.name == "ardupilot")
        self.out: list[Any] = []
        self.executions: list[ExecutedCommand] = []
        self.statustexts: deque[tuple[int, str]] = deque(maxlen=200)
        self.reached: list[int] = []  # MISSION_ITEM_REACHED seqs, in order (bounded below)
        self.stats = Stats()
        self.rng = random.Random(opts.seed)
        self.ground_amsl_m = opts.ground_amsl_m
        self.lat_deg = opts.lat_deg
        self.lon_deg = opts.lon_deg
        self.alt_m = 0.0  # above home/ground
        self.heading_deg = opts.heading_deg
        self.consumed_mah = 0.0
        self.sortie: Any = None  # mavjet.sim.sortie.Sortie when flying the built-in sortie
        self.external_control = False  # a ground station has commanded flight: the sortie steps aside
        self.reboot_pending = False
        self.reboots = 0
        self._forced: dict[int, deque[int]] = {}  # MAV_CMD -> results to answer instead of executing
        self._after_ack: list[Any] = []  # what ArduPilot says right after a COMMAND_ACK ("Arm: ..." reasons)
        self._vtol_state = R.MAV_VTOL_STATE_MC if opts.flavour.name == "ardupilot" else R.MAV_VTOL_STATE_UNDEFINED
        self.now = 0.0
        self._boot(0.0)
        self.schedule.reset(opts.heartbeat_phase_s)  # the first HEARTBEAT at this vehicle's phase

    # ------------------------------------------------------------------ boot
    def _boot(self, now: float) -> None:
        """Power-on state; params, missions, position and battery charge survive a reboot."""
        self.sysid = int(self.params["MAV_SYSID"])
        self.now = now
        self.boot_at = now
        # ArduPilot reports system_status BOOT until its init is over; a mode set meanwhile is
        # overridden by the boot mode, and arming is refused ("Arm: System not initialised").
        self.initialised = self.flavour.name != "ardupilot" or self.opts.boot_s <= 0
        self._next_timesync = now + TIMESYNC_S
        self.armed = False
        self.fmode: Mode = self._mode_or_die(self.flavour.initial)
        self.mode_reason = "boot"
        self.landed = self.alt_m <= 0.0
        self.alt_m = max(self.alt_m, 0.0)
        self.vn = self.ve = self.vd = 0.0
        self.roll = self.pitch = 0.0
        self.home: tuple[float, float, float] | None = None
        self.missions.home_item = None
        self.missions.reset_transfers()
        self.gps_fix = False
        self.ekf_ok = False
        self.takeoff_alt_m: float | None = None
        self.target: tuple[float, float, float] | None = None
        self.speed_m_s: float | None = None
        self.rtl_phase = ""
        self.rtl_alt_m = 0.0
        self.rtl_wait_until = 0.0
        self.mission_seq = 1
        self.mission_state = R.MISSION_STATE_NOT_STARTED
        self.item_started = False
        self.item_hold_until: float | None = None
        self.battery_fs = 0  # 0 none, 1 low, 2 critical
        self._next_battery_check = now
        self.fence = FenceState()
        self.landed_since = now
        self._next_prearm_text = now + PREARM_DISPLAY_S
        self._prearm_ok = False  # a check that starts failing after passing is printed at once
        self._next_prearm_check = now
        self._sent: dict[int, Sent] = {}
        self._pending: list[Pending] = []
        self.schedule.reset(now)
        self.reboot_pending = False
        self._text(R.MAV_SEVERITY_INFO, telemetry.firmware_string(self))

    def reboot_now(self, now: float) -> None:
        """Come back from a reboot (the I/O layer calls this once the downtime is over)."""
        self.reboots += 1
        self._boot(now)

    def _mode_or_die(self, name: str) -> Mode:
        m = self.flavour.by_name(name)
        if m is None:
            raise ValueError(f"flavour {self.flavour.name} has no mode {name}")
        return m

    # ------------------------------------------------------------------ public state
    @property
    def mode(self) -> str:
        """The flavour's name for the current mode ("GUIDED", "AUTO.MISSION", ...)."""
        return self.fmode.name

    @property
    def boot_ms(self) -> int:
        return int((self.now - self.boot_at) * 1000)

    @property
    def alt_amsl_m(self) -> float:
        return self.ground_amsl_m + self.alt_m

    @property
    def groundspeed_m_s(self) -> float:
        return math.hypot(self.vn, self.ve)

    @property
    def climb_m_s(self) -> float:
        return -self.vd

    @property
    def capacity_mah(self) -> float:
        return max(self.params["BATT_CAPACITY"], 1.0)

    @property
    def battery_pct(self) -> float:
        return max(0.0, min(100.0, 100.0 * (1.0 - self.consumed_mah / self.capacity_mah)))

    @property
    def battery_v(self) -> float:
        """Resting voltage of a 4S pack: 3.5 V/cell empty to 4.2 V/cell full."""
        return 4 * (3.5 + 0.7 * self.battery_pct / 100.0)

    @property
    def current_a(self) -> float:
        if not self.armed:
            return 0.3
        if self.landed:
            return 1.5
        return 12.0 + 4.0 * max(self.climb_m_s, 0.0) + 0.3 * self.groundspeed_m_s

    @property
    def position_ok(self) -> bool:
        return self.gps_fix and self.ekf_ok

    @property
    def landed_state(self) -> int:
        if not self.armed or self.landed:
            return ON_GROUND
        if self.takeoff_alt_m is not None:
            return TAKEOFF
        if flight.descending_to_land(self):
            return LANDING
        return IN_AIR

    @property
    def mission(self) -> list[SimMissionItem]:
        """The MISSION list as a download returns it (seq 0 is the live home)."""
        return self.missions.items(MISSION)

    @property
    def fence_items(self) -> list[SimMissionItem]:
        return self.missions.items(FENCE)

    @property
    def failsafe(self) -> bool:
        return self.battery_fs > 0

    def set_battery_pct(self, pct: float) -> None:
        """Fault injection: jump the remaining charge (failsafes follow on the next step)."""
        pct = max(0.0, min(100.0, pct))
        self.consumed_mah = self.capacity_mah * (1.0 - pct / 100.0)
        if self.battery_fs and not failsafe.battery_level(self):
            self.battery_fs = 0  # a fresh battery clears the failsafe
        self._next_battery_check = self.now

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
        self._forced.setdefault(int(command), deque()).extend([int(result)] * count)

    def forced_pending(self, command: int) -> int:
        """How many forced results `reject_next` still holds for `command`."""
        return len(self._forced.get(int(command), ()))

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

    # ------------------------------------------------------------------ mission view
    @property
    def _is_ap(self) -> bool:
        return self.flavour.name == "ardupilot"

    def _mission(self) -> list[SimMissionItem]:
        """The MISSION list indexed as ArduPilot's, home at 0: PX4's has no home, so a placeholder stands there
        (its items keep their own seq, which MISSION_ITEM_REACHED reports); see `_seq_offset`."""
        items = self.missions.items(MISSION)
        if self.missions.home_at_seq0:
            return items
        return [SimMissionItem(seq=0, frame=R.MAV_FRAME_GLOBAL, command=R.MAV_CMD_NAV_WAYPOINT), *items]

    @property
    def _seq_offset(self) -> int:
        """`mission_seq` (index into `_mission()`) minus the seq on the wire: 1 on PX4, 0 on ArduPilot."""
        return 0 if self.missions.home_at_seq0 else 1

    # ------------------------------------------------------------------ output helpers
    def _send(self, msg: Any) -> None:
        self.out.append(msg)

    def _text(self, severity: int, text: str) -> None:
        self.statustexts.append((severity, text))
        self.out.append(R.MAVLink_statustext_message(severity, text.encode()[:50], 0, 0))

    def _ack(self, command: int, result: int, partner: tuple[int, int], progress: int = 0) -> None:
        self.out.append(R.MAVLink_command_ack_message(command, result, progress, 0, partner[0], partner[1]))

    def _send_param(self, idx: int, wire_index: int | None = None) -> None:
        """A PARAM_VALUE for param `idx` (tests use it to stand for a change made on another link)."""
        stores.send_param(self, idx, wire_index)

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
            control.checks(self)
            if self.sortie is not None and not self.external_control:
                self.sortie.step(self, self.now)
            if self._pending:
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
