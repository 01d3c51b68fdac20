"""One simulated ArduCopter, sans-IO: MAVLink messages in, MAVLink messages out.

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
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final

from pymavlink.dialects.v20 import ardupilotmega as mavlink2

from sim import encoder as enc
from sim import geo, params, streams
from sim.logs import DISARM_TEXT, LogServer, default_logs
from sim.missions import FENCE, MISSION, RALLY, MissionServer, SimMissionItem
from sim.modes import Mode, SimFlavour, px4_custom
from sim.terrain import TERRAIN_FRAMES, TerrainServer

MAX_DT: Final = 0.1  # physics and telemetry resolution, sim seconds
FORCE_MAGIC: Final = 21196  # COMPONENT_ARM_DISARM param2 that skips checks
COMP_AUTOPILOT: Final = 1
BATTERY_CHECK_S: Final = 0.5  # sim seconds between battery failsafe checks
MAX_EXECUTIONS: Final = 10_000  # the record keeps at least this many recent commands
# ArduPilot runs its pre-arm checks at 1 Hz but prints a failing one only every
# PREARM_DISPLAY_PERIOD (AP_Arming: 30 s); the first line came 30 s after boot on SITL.
PREARM_DISPLAY_S: Final = 30.0
TIMESYNC_S: Final = 10.0  # ArduPilot asks every link for a TIMESYNC this often (sim seconds; tc1 = 0)
NO_INDEX: Final = 65535  # PARAM_VALUE.param_index ArduPilot sends for reads by name, sets and broadcasts
# ArduCopter's HEARTBEAT sets GUIDED_ENABLED while its horizontal position controller runs: always in
# GUIDED and LAND (seen after a LAND's disarm too), in the other position modes only while armed (RTL
# reads 0x51 once it has landed and disarmed), and during BOOT (0x59 before "ArduPilot Ready").
_AP_GUIDED_ALWAYS: Final = frozenset({"GUIDED", "LAND"})
_AP_GUIDED_ARMED: Final = frozenset({"AUTO", "RTL", "LOITER", "POSHOLD", "BRAKE", "SMART_RTL"})
_AP_BOOT_BASE_MODE: Final = 0x59

R = mavlink2  # brevity for MAV_* constants
ACCEPTED: Final[int] = R.MAV_RESULT_ACCEPTED
_PX4_MANUAL_MAINS: Final = frozenset({1, 2, 3, 7})  # MANUAL, ALTCTL, POSCTL, STABILIZED
_PX4_MAIN_AUTO: Final = 4
# commands PX4's Commander answers TEMPORARILY_REJECTED when it denies the transition they ask for
_PX4_TRANSITIONS: Final = frozenset({
    R.MAV_CMD_COMPONENT_ARM_DISARM, R.MAV_CMD_DO_SET_MODE, R.MAV_CMD_NAV_RETURN_TO_LAUNCH, R.MAV_CMD_NAV_TAKEOFF,
    R.MAV_CMD_DO_REPOSITION,
})  # fmt: skip
TEMP_REJECTED: Final[int] = R.MAV_RESULT_TEMPORARILY_REJECTED
DENIED: Final[int] = R.MAV_RESULT_DENIED
UNSUPPORTED: Final[int] = R.MAV_RESULT_UNSUPPORTED
FAILED: Final[int] = R.MAV_RESULT_FAILED
IN_PROGRESS: Final[int] = R.MAV_RESULT_IN_PROGRESS
_FORCEABLE: Final = frozenset(k for k in R.enums["MAV_RESULT"] if k < R.MAV_RESULT_ENUM_END)

ON_GROUND: Final[int] = R.MAV_LANDED_STATE_ON_GROUND
IN_AIR: Final[int] = R.MAV_LANDED_STATE_IN_AIR
TAKEOFF: Final[int] = R.MAV_LANDED_STATE_TAKEOFF
LANDING: Final[int] = R.MAV_LANDED_STATE_LANDING

_NAV_CMDS_MAX: Final = 95  # MAV_CMD ids below this are navigation commands
_GLOBAL_AMSL_FRAMES: Final = frozenset({R.MAV_FRAME_GLOBAL, R.MAV_FRAME_GLOBAL_INT})

_SENSORS: Final[int] = (
    R.MAV_SYS_STATUS_SENSOR_3D_GYRO
    | R.MAV_SYS_STATUS_SENSOR_3D_ACCEL
    | R.MAV_SYS_STATUS_SENSOR_3D_MAG
    | R.MAV_SYS_STATUS_SENSOR_ABSOLUTE_PRESSURE
    | R.MAV_SYS_STATUS_SENSOR_GPS
    | R.MAV_SYS_STATUS_SENSOR_ANGULAR_RATE_CONTROL
    | R.MAV_SYS_STATUS_SENSOR_ATTITUDE_STABILIZATION
    | R.MAV_SYS_STATUS_SENSOR_YAW_POSITION
    | R.MAV_SYS_STATUS_SENSOR_Z_ALTITUDE_CONTROL
    | R.MAV_SYS_STATUS_SENSOR_XY_POSITION_CONTROL
    | R.MAV_SYS_STATUS_SENSOR_MOTOR_OUTPUTS
    | R.MAV_SYS_STATUS_AHRS
    | R.MAV_SYS_STATUS_SENSOR_BATTERY
    | R.MAV_SYS_STATUS_PREARM_CHECK
)


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


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutedCommand:
    """A command the vehicle acted on (retransmissions it recognised are not recorded)."""

    command: int
    params: tuple[float, ...]  # param1..param7 (COMMAND_INT: x and y as sent, integers)
    time: float  # sim seconds
    result: int  # MAV_RESULT of the first answer
    confirmation: int = 0
    frame: int | None = None  # COMMAND_INT only
    source: tuple[int, int] = (0, 0)  # sender sysid, compid
    executed: bool = True  # False: answered with a result forced by `reject_next`, not acted on


@dataclass(slots=True)
class _Sent:
    """The answer to a command, kept to answer its retransmissions the same way."""

    params: tuple[float, ...]
    wall: float
    result: int
    progress: int = 0


@dataclass(slots=True)
class _Pending:
    """A command answered IN_PROGRESS whose final answer is still to come."""

    command: int
    partner: tuple[int, int]
    due: float | None  # sim time of the final answer, None: decided by flight state (takeoff)
    result: int = ACCEPTED
    last_progress: float = 0.0


@dataclass(slots=True)
class _Fence:
    breach_type: int = 0  # FENCE_BREACH_*
    breach_count: int = 0
    breach_time_ms: int = 0


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
        self.schedule = streams.Schedule()
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
        self.sortie: Any = None  # sim.sortie.Sortie when flying the built-in sortie
        self.external_control = False  # a ground station has commanded flight: the sortie steps aside
        self.reboot_pending = False
        self.reboots = 0
        self._forced: dict[int, deque[int]] = {}  # MAV_CMD -> results to answer instead of executing
        self._after_ack: list[Any] = []  # what ArduPilot says right after a COMMAND_ACK ("Arm: ..." reasons)
        self._vtol_state = R.MAV_VTOL_STATE_MC if opts.flavour.name == "ardupilot" else R.MAV_VTOL_STATE_UNDEFINED
        self.now = 0.0
        self._boot(0.0)

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
        self.fence = _Fence()
        self.landed_since = now
        self._next_prearm_text = now + PREARM_DISPLAY_S
        self._prearm_ok = False  # a check that starts failing after passing is printed at once
        self._next_prearm_check = now
        self._sent: dict[int, _Sent] = {}
        self._pending: list[_Pending] = []
        self.schedule.reset(now)
        self.reboot_pending = False
        self._text(R.MAV_SEVERITY_INFO, self._firmware_string())

    def reboot_now(self, now: float) -> None:
        """Come back from a reboot (the I/O layer calls this once the downtime is over)."""
        self.reboots += 1
        self._boot(now)

    def _firmware_string(self) -> str:
        maj, mnr, pat = self.flavour.version
        name = "ArduCopter" if self.flavour.name == "ardupilot" else "PX4"
        dev = "-dev" if self.flavour.name == "ardupilot" else ""
        return f"{name} V{maj}.{mnr}.{pat}{dev} (mavjet sim)"

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
        if self._descending_to_land():
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
        if self.battery_fs and not self._battery_level():
            self.battery_fs = 0  # a fresh battery clears the failsafe
        self._next_battery_check = self.now

    def reject_next(self, command: int, result: int, count: int = 1) -> None:
        """Fault injection: answer the next `count` new `command`s with `result` without executing them.

        Each is recorded in `executions` with `executed=False`. Its
        retransmissions (confirmation > 0, same params) get the same answer
        without using up another of the `count`, like any command the
        vehicle already answered. Calls add up, in order; a reboot keeps them.
        """
        if result == IN_PROGRESS or result not in _FORCEABLE:
            raise ValueError(f"reject_next: result must be a final MAV_RESULT (not IN_PROGRESS), got {result}")
        if count < 1:
            raise ValueError(f"reject_next: count must be at least 1, got {count}")
        self._forced.setdefault(int(command), deque()).extend([int(result)] * count)

    def forced_pending(self, command: int) -> int:
        """How many forced results `reject_next` still holds for `command`."""
        return len(self._forced.get(int(command), ()))

    # ------------------------------------------------------------------ output helpers
    def _send(self, msg: Any) -> None:
        self.out.append(msg)

    def _text(self, severity: int, text: str) -> None:
        self.statustexts.append((severity, text))
        self.out.append(R.MAVLink_statustext_message(severity, text.encode()[:50], 0, 0))

    def _ack(self, command: int, result: int, partner: tuple[int, int], progress: int = 0) -> None:
        self.out.append(R.MAVLink_command_ack_message(command, result, progress, 0, partner[0], partner[1]))

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

    def _on_heartbeat(self, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
        return None  # ground stations' heartbeats need no answer

    def _on_timesync(self, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
        if msg.tc1 == 0:
            self._send(R.MAVLink_timesync_message(int((now - self.boot_at) * 1e9), msg.ts1))

    def _on_request_data_stream(self, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
        self.schedule.request_stream(int(msg.req_stream_id), float(msg.req_message_rate), bool(msg.start_stop), now)

    def _on_set_mode(self, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
        self.external_control = True
        result = self._set_mode_raw(float(msg.base_mode), int(msg.custom_mode), None)
        self._ack(R.MAVLINK_MSG_ID_SET_MODE, result, partner)

    def _on_param_request_list(self, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
        for i in range(len(params.SPECS)):
            self._send_param(i)

    def _on_param_request_read(self, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
        idx = int(msg.param_index)
        if idx < 0:
            idx = params.INDEX.get(_param_name(msg.param_id), -1)
        if 0 <= idx < len(params.SPECS):
            # ArduPilot echoes the request's index: -1 (65535 on the wire) for a read by name
            self._send_param(idx, NO_INDEX if int(msg.param_index) < 0 and self._is_ap else idx)

    def _on_param_set(self, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
        name = _param_name(msg.param_id)
        spec = params.BY_NAME.get(name)
        if spec is None:
            return  # ArduPilot ignores unknown names
        value = float(msg.param_value)
        if not self._is_ap:
            # PX4's mavlink_parameters.cpp: the declared type must be the param's own (else "param types
            # mismatch", no answer); an INT32 gets the float's bytes copied in
            if int(msg.param_type) != (params.REAL32 if spec.type == params.REAL32 else params.INT32):
                return
            if spec.type != params.REAL32:
                value = params.from_bytewise(value)
        if not math.isfinite(value):
            return
        self.params[name] = params.coerce(spec, value)
        self._send_param(params.INDEX[name], NO_INDEX)  # to every link, as ArduPilot broadcasts a change

    def _send_param(self, idx: int, wire_index: int | None = None) -> None:
        spec = params.SPECS[idx]
        index = idx if wire_index is None else wire_index
        value, ptype = self.params[spec.name], spec.type
        if not self._is_ap:
            # PX4's MavlinkParametersManager::send_param: always the param's own index, INT32 or REAL32 only,
            # an INT32's bytes copied into the float (MAV_PROTOCOL_CAPABILITY_PARAM_ENCODE_BYTEWISE)
            index = idx
            if ptype != params.REAL32:
                value, ptype = params.to_bytewise(value), params.INT32
        self._send(R.MAVLink_param_value_message(spec.name.encode(), value, ptype, len(params.SPECS), index))

    def _notify_param(self, name: str, value: float) -> None:
        """An unsolicited PARAM_VALUE (index 65535) when the vehicle changes a parameter itself."""
        if self.params.get(name) != value:
            self.params[name] = value
            self._send_param(params.INDEX[name], NO_INDEX)

    def _on_mission_count(self, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
        self.out.extend(self.missions.on_count(msg, partner, now))
        up = self.missions.upload
        if self._is_ap and up is not None and up.mission_type == MISSION and self.params["MIS_TOTAL"] > up.count:
            self._notify_param("MIS_TOTAL", float(up.count))  # AP_Mission truncates at MISSION_COUNT

    def _on_mission_item(self, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
        replies = self.missions.on_item(msg, partner, now)
        self.out.extend(replies)
        up = self.missions.upload
        if self._is_ap and up is not None and up.mission_type == MISSION and len(up.items) > self.params["MIS_TOTAL"]:
            self._notify_param("MIS_TOTAL", float(len(up.items)))  # each stored item grows the total
        self._mission_committed()
        if self._is_ap:
            self._after_upload(replies)

    @property
    def _is_ap(self) -> bool:
        return self.flavour.name == "ardupilot"

    def _after_upload(self, replies: list[Any]) -> None:
        """What ArduPilot says after a completed upload: a text and the list's *_TOTAL parameter."""
        for r in replies:
            if r.get_type() != "MISSION_ACK":
                continue
            mtype = int(r.mission_type)
            if mtype == MISSION:
                self._notify_param("MIS_TOTAL", float(self.missions.count(MISSION)))
                if r.type == R.MAV_MISSION_ACCEPTED:
                    self._text(R.MAV_SEVERITY_INFO, "Flight plan received")
            elif mtype == FENCE and r.type == R.MAV_MISSION_ACCEPTED:
                self._text(R.MAV_SEVERITY_DEBUG, "Fence Indexed OK")
                self._notify_param("FENCE_TOTAL", float(_fence_total(self.missions.items(FENCE))))
            elif mtype == RALLY and r.type == R.MAV_MISSION_ACCEPTED:
                self._notify_param("RALLY_TOTAL", float(len(self.missions.items(RALLY))))

    def _on_mission_request_list(self, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
        self.out.extend(self.missions.on_request_list(msg, partner))

    def _on_mission_request(self, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
        self.out.extend(self.missions.on_request(msg, partner))

    def _on_mission_clear_all(self, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
        self.out.extend(self.missions.on_clear(msg, partner))
        self._mission_committed()

    def _on_mission_set_current(self, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
        if self._set_mission_current(int(msg.seq) + self._seq_offset):
            self._send_mission_current()

    def _on_mission_ack(self, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
        return None  # ends a download; nothing is tracked for downloads

    def _on_log_message(self, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
        if self.armed:  # ArduPilot: one STATUSTEXT, then silence until disarmed
            if self.logs.warn_armed(True):
                self._text(3, DISARM_TEXT)
            return
        self.logs.warn_armed(False)
        mtype = msg.get_type()
        if mtype == "LOG_REQUEST_LIST":
            self.out.extend(self.logs.on_request_list(msg))
        elif mtype == "LOG_REQUEST_DATA":
            self.out.extend(self.logs.on_request_data(msg))
        else:
            self.out.extend(self.logs.on_request_end())

    def _on_terrain_data(self, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
        if self.params["TERRAIN_ENABLE"]:
            self.terrain.on_data(msg)

    def _on_terrain_check(self, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
        """Answered at once for that point (AP_Terrain::handle_terrain_check); a new block starts loading."""
        if self.flavour.name != "ardupilot":
            return  # PX4 has no terrain protocol (and refuses terrain frames)
        lat, lon = int(msg.lat), int(msg.lon)
        if not self.params["TERRAIN_ENABLE"]:  # no cache allocated: no data, nothing pending
            self._send(mavlink2.MAVLink_terrain_report_message(lat, lon, 0, 0.0, 0.0, 0, 0))
            return
        self._terrain_in_use = True
        self._send(self.terrain.report(lat, lon, home=self._terrain_home(), rel_alt_m=self.alt_m))

    def _terrain_position(self) -> tuple[int, int] | None:
        return (round(self.lat_deg * 1e7), round(self.lon_deg * 1e7)) if self.position_ok else None

    def _terrain_home(self) -> tuple[int, int] | None:
        return None if self.home is None else (round(self.home[0] * 1e7), round(self.home[1] * 1e7))


    def _mission_committed(self) -> None:
        if MISSION in self.missions.changed:
            self.missions.changed.discard(MISSION)
            self.mission_seq = 1
            self.item_started = False
            self.terrain.set_points(self._mission()[1:])
            # AP_Arming::terrain_database_required: the mission holds terrain-frame items.
            self._terrain_required = any(int(it.frame) in TERRAIN_FRAMES for it in self._mission()[1:])
            self._terrain_in_use = self._terrain_in_use or not self.terrain.points_done
            self.mission_state = R.MISSION_STATE_NOT_STARTED if len(self._mission()) > 1 else R.MISSION_STATE_NO_MISSION
            if self.fmode.behaviour == "auto" and len(self._mission()) <= 1:
                self._enter_mode(self._mode_or_die(self.flavour.hold), "mission_cleared")
        self.missions.changed.discard(FENCE)

    # ------------------------------------------------------------------ commands
    def _on_command_long(self, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
        if msg.target_component not in (0, self.compid):
            return
        p = (msg.param1, msg.param2, msg.param3, msg.param4, msg.param5, msg.param6, msg.param7)
        self._command(int(msg.command), p=p, frame=None, confirmation=int(msg.confirmation), partner=partner, now=now, wall=wall)

    def _on_command_int(self, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
        if msg.target_component not in (0, self.compid):
            return
        p = (msg.param1, msg.param2, msg.param3, msg.param4, float(msg.x), float(msg.y), msg.z)
        self._command(int(msg.command), p=p, frame=int(msg.frame), confirmation=0, partner=partner, now=now, wall=wall)

    def _command(
        self,
        cmd: int,
        *,
        p: tuple[float, ...],
        frame: int | None,
        confirmation: int,
        partner: tuple[int, int],
        now: float,
        wall: float,
    ) -> None:
        self.stats.commands += 1
        prior = self._sent.get(cmd)
        if (
            confirmation > 0
            and prior is not None
            and prior.params == p
            and wall - prior.wall <= self.opts.confirmation_window_s
        ):
            # a retransmission of a command already acted on: answer again, do not act twice
            self.stats.retransmits_recognised += 1
            prior.wall = wall
            self._ack(cmd, prior.result, partner, prior.progress)
            return
        forced = self._forced.get(cmd)
        if forced:
            result = forced.popleft()
            if not forced:
                del self._forced[cmd]
            self.stats.forced_results += 1
            self._sent[cmd] = _Sent(params=p, wall=wall, result=result)
            self._record(
                ExecutedCommand(command=cmd, params=p, time=now, result=result, confirmation=confirmation, frame=frame,
                                source=partner, executed=False)
            )  # fmt: skip
            self._ack(cmd, result, partner)
            return
        handler = _COMMANDS.get(cmd)
        if handler is None:
            self.stats.unknown_commands += 1
            result = UNSUPPORTED
        else:
            if cmd in _FLIGHT_COMMANDS:
                self.external_control = True
            result = handler(self, p, frame, partner, now)
            if result == FAILED and cmd in _PX4_TRANSITIONS and self.flavour.name == "px4":
                result = TEMP_REJECTED  # PX4's Commander answers a denied mode/arming transition this way
        slow = result == ACCEPTED and cmd in self.opts.in_progress_commands
        if slow:
            due = None if cmd == R.MAV_CMD_NAV_TAKEOFF else now + self.opts.in_progress_delay_s
            self._pending.append(_Pending(command=cmd, partner=partner, due=due, last_progress=now))
            result = IN_PROGRESS
        self._sent[cmd] = _Sent(params=p, wall=wall, result=result)
        self._record(
            ExecutedCommand(command=cmd, params=p, time=now, result=result, confirmation=confirmation, frame=frame, source=partner)
        )
        self._ack(cmd, result, partner)
        self._flush_after_ack()
        if cmd == R.MAV_CMD_REQUEST_MESSAGE and result == ACCEPTED:
            self._send_requested(int(p[0]))
        elif cmd == R.MAV_CMD_REQUEST_AUTOPILOT_CAPABILITIES and result == ACCEPTED:
            self._send(self._autopilot_version())
        elif cmd == R.MAV_CMD_GET_MESSAGE_INTERVAL and result == ACCEPTED:
            iv = self.schedule.interval(int(p[0]))
            self._send(R.MAVLink_message_interval_message(int(p[0]), -1 if iv is None else int(iv * 1e6)))
        elif cmd == R.MAV_CMD_PREFLIGHT_REBOOT_SHUTDOWN and result == ACCEPTED:
            self.reboot_pending = True

    def _flush_after_ack(self) -> None:
        if self._after_ack:
            self.out.extend(self._after_ack)
            self._after_ack.clear()

    def _record(self, ex: ExecutedCommand) -> None:
        self.executions.append(ex)
        if len(self.executions) > 2 * MAX_EXECUTIONS:
            del self.executions[:-MAX_EXECUTIONS]

    def _finish_pending(self, pend: _Pending, result: int) -> None:
        self._pending.remove(pend)
        sent = self._sent.get(pend.command)
        if sent is not None and sent.result == IN_PROGRESS:
            sent.result = result
            sent.progress = 100 if result == ACCEPTED else 0
        self._ack(pend.command, result, pend.partner, 100 if result == ACCEPTED else 0)

    def _poll_pending(self, now: float) -> None:
        for pend in list(self._pending):
            if pend.due is not None:
                if now >= pend.due:
                    self._finish_pending(pend, pend.result)
                continue
            # takeoff: done when the climb is over, failed when it was abandoned
            if self.takeoff_alt_m is None:
                ok = self.armed and not self.landed
                self._finish_pending(pend, ACCEPTED if ok else FAILED)
            elif now - pend.last_progress >= 1.0:
                pend.last_progress = now
                progress = int(100 * self.alt_m / max(self.takeoff_alt_m, 0.1))
                sent = self._sent.get(pend.command)
                if sent is not None:
                    sent.progress = progress
                self._ack(pend.command, IN_PROGRESS, pend.partner, max(0, min(progress, 99)))

    def _abort_takeoff(self) -> None:
        self.takeoff_alt_m = None

    # --- individual commands: (self, params, frame, partner, now) -> MAV_RESULT
    def _cmd_arm_disarm(self, p: tuple[float, ...], frame: int | None, partner: tuple[int, int], now: float) -> int:
        force = round(p[1]) == FORCE_MAGIC
        if p[0] == 1.0:
            return self.arm(force=force)
        if p[0] == 0.0:
            return self.disarm(force=force)
        return DENIED

    def _cmd_takeoff(self, p: tuple[float, ...], frame: int | None, partner: tuple[int, int], now: float) -> int:
        return self.takeoff(float(p[6]))

    def _cmd_land(self, p: tuple[float, ...], frame: int | None, partner: tuple[int, int], now: float) -> int:
        return self.set_mode(self.flavour.land, reason="gcs_land")

    def _cmd_rtl(self, p: tuple[float, ...], frame: int | None, partner: tuple[int, int], now: float) -> int:
        return self.set_mode(self.flavour.rtl, reason="gcs_rtl")

    def _cmd_do_set_mode(self, p: tuple[float, ...], frame: int | None, partner: tuple[int, int], now: float) -> int:
        return self._set_mode_raw(p[0], round(p[1]), round(p[2]))

    def _cmd_reposition(self, p: tuple[float, ...], frame: int | None, partner: tuple[int, int], now: float) -> int:
        if frame is None:  # COMMAND_LONG: degrees in param5/6, altitude relative to home
            lat, lon, frame = p[4], p[5], R.MAV_FRAME_GLOBAL_RELATIVE_ALT
        else:
            lat, lon = p[4] / 1e7, p[5] / 1e7
        if not (-90.0 <= lat <= 90.0 and -180.0 <= lon <= 180.0) or (lat == 0.0 and lon == 0.0):
            return DENIED
        change_mode = int(p[1]) & R.MAV_DO_REPOSITION_FLAGS_CHANGE_MODE
        if self.flavour.name == "px4" and (not change_mode or int(p[1]) & ~1):
            return UNSUPPORTED  # PX4's commander: a reposition must ask for the mode switch, and only that
        if self.fmode.behaviour != "guided":
            if not change_mode and self.flavour.name == "ardupilot":
                return DENIED
            r = self.set_mode(self.flavour.guided, reason="gcs_reposition")
            if r != ACCEPTED:
                return FAILED
        alt = self._rel_alt(float(p[6]), frame)
        if not math.isfinite(alt):
            alt = self.alt_m
        if p[0] > 0:
            self.speed_m_s = float(p[0])
        return self.goto(lat, lon, alt)

    def _cmd_mission_start(self, p: tuple[float, ...], frame: int | None, partner: tuple[int, int], now: float) -> int:
        first = round(p[0])
        start = first + self._seq_offset if first > 0 else 1  # the first item after the home
        result = self.set_mode(self.flavour.auto, reason="gcs_mission_start")
        if result != ACCEPTED:
            return result
        if first > 0 and not self._set_mission_current(start):
            return FAILED
        if self.mission_state != R.MISSION_STATE_ACTIVE:
            self._auto_start(start)
        return ACCEPTED

    def _cmd_reboot(self, p: tuple[float, ...], frame: int | None, partner: tuple[int, int], now: float) -> int:
        if round(p[0]) not in (1, 3):
            return UNSUPPORTED if round(p[0]) != 0 else ACCEPTED
        if self.armed:
            return FAILED
        return ACCEPTED  # the reboot happens once the ACK is out (reboot_pending)

    def _cmd_set_message_interval(self, p: tuple[float, ...], frame: int | None, partner: tuple[int, int], now: float) -> int:
        return ACCEPTED if self.schedule.set_interval(round(p[0]), float(p[1]), now) else FAILED

    def _cmd_get_message_interval(self, p: tuple[float, ...], frame: int | None, partner: tuple[int, int], now: float) -> int:
        return ACCEPTED if round(p[0]) in streams.STREAMABLE else FAILED

    def _cmd_request_message(self, p: tuple[float, ...], frame: int | None, partner: tuple[int, int], now: float) -> int:
        msg_id = round(p[0])
        if msg_id == R.MAVLINK_MSG_ID_AUTOPILOT_VERSION:
            return ACCEPTED
        if msg_id == streams.HOME_POSITION and self.home is None:
            return FAILED
        return ACCEPTED if msg_id in streams.STREAMABLE else FAILED

    def _cmd_capabilities(self, p: tuple[float, ...], frame: int | None, partner: tuple[int, int], now: float) -> int:
        return ACCEPTED

    def _cmd_set_mission_current(self, p: tuple[float, ...], frame: int | None, partner: tuple[int, int], now: float) -> int:
        if not self._set_mission_current(round(p[0]) + self._seq_offset):
            return FAILED
        self._send_mission_current()
        return ACCEPTED

    def _cmd_change_speed(self, p: tuple[float, ...], frame: int | None, partner: tuple[int, int], now: float) -> int:
        if p[1] > 0:
            self.speed_m_s = float(p[1])
        return ACCEPTED

    def _cmd_set_home(self, p: tuple[float, ...], frame: int | None, partner: tuple[int, int], now: float) -> int:
        if round(p[0]) == 1:
            if not self.position_ok:
                return FAILED
            self._set_home(self.lat_deg, self.lon_deg, self.alt_amsl_m)
            return ACCEPTED
        lat, lon = (p[4], p[5]) if frame is None else (p[4] / 1e7, p[5] / 1e7)
        if not (-90.0 <= lat <= 90.0 and -180.0 <= lon <= 180.0) or (lat == 0.0 and lon == 0.0):
            return DENIED
        self._set_home(lat, lon, float(p[6]))
        return ACCEPTED

    def _cmd_fence_enable(self, p: tuple[float, ...], frame: int | None, partner: tuple[int, int], now: float) -> int:
        if round(p[0]) not in (0, 1):
            return UNSUPPORTED
        self.params["FENCE_ENABLE"] = float(round(p[0]))
        return ACCEPTED

    def _cmd_get_home(self, p: tuple[float, ...], frame: int | None, partner: tuple[int, int], now: float) -> int:
        if self.home is None:
            return FAILED
        self._send(self._home_position())
        return ACCEPTED

    # ------------------------------------------------------------------ flight API (also used by the sortie)
    def arm(self, *, force: bool = False) -> int:
        if self.armed:
            return ACCEPTED
        if not self.initialised:  # the one refusal whose text ArduPilot sends before the ACK
            self._text(R.MAV_SEVERITY_CRITICAL, "Arm: System not initialised")
            return FAILED
        if not force and self.params["ARMING_CHECK"] != 0:
            reason = self._prearm_failure()
            if reason is not None:
                if self.flavour.name == "ardupilot":
                    # ArduPilot's arming checks report "Arm: <reason>" after the COMMAND_ACK goes out
                    # (the "PreArm: " form is only the periodic display, see _prearm_update).
                    arm_text = "Arm: " + reason.removeprefix("PreArm: ").removeprefix("Arm: ")
                    self.statustexts.append((R.MAV_SEVERITY_CRITICAL, arm_text))
                    self._after_ack.append(
                        R.MAVLink_statustext_message(R.MAV_SEVERITY_CRITICAL, arm_text.encode()[:50], 0, 0)
                    )
                else:
                    self._text(R.MAV_SEVERITY_CRITICAL, reason)
                return FAILED
        self.armed = True
        self.landed = self.alt_m <= 0.05
        self.landed_since = self.now
        if self.position_ok:  # ArduPilot re-sets home (and re-sends the EKF origin) at every arming
            self._send_origin()
            self._set_home(self.lat_deg, self.lon_deg, self.alt_amsl_m)
        self._text(R.MAV_SEVERITY_INFO, "Arming motors")
        return ACCEPTED

    def _prearm_failure(self) -> str | None:
        if not self.fmode.armable and not (
            self.fmode.behaviour == "auto" and int(self.params["AUTO_OPTIONS"]) & 1 and self.flavour.name == "ardupilot"
        ):
            return "Arm: Mode not armable"
        if self.fmode.needs_position and self.flavour.name == "ardupilot" and not self.position_ok:
            return "PreArm: Need Position Estimate"  # what ArduCopter says in GUIDED before the EKF uses GPS
        if not self.gps_fix:
            return "PreArm: Need 3D Fix"
        if not self.ekf_ok:
            return "PreArm: EKF3 still initialising"
        if self.battery_fs or self._battery_level():
            return "PreArm: Battery 1 low voltage failsafe"
        arm_volt = self.params["BATT_ARM_VOLT"]
        if arm_volt > 0 and self.battery_v < arm_volt:
            return "PreArm: Battery 1 below minimum arming voltage"
        if self.params["FENCE_ENABLE"] and self._fence_breach() != 0:
            return "PreArm: Fence: vehicle outside fence"
        if self._terrain_required:
            if not self.params["TERRAIN_ENABLE"]:
                return "PreArm: terrain disabled"
            if not self.terrain.prearm_ok(self._terrain_position(), self._terrain_home()):
                return "PreArm: waiting for terrain data"
        return None

    def disarm(self, *, force: bool = False) -> int:
        if not self.armed:
            return ACCEPTED
        if not self.landed and not force:
            if self.flavour.name == "px4":  # Commander::disarm
                self._text(R.MAV_SEVERITY_CRITICAL, "Disarming denied: not landed")
            return FAILED
        self._disarm("gcs")
        return ACCEPTED

    def _disarm(self, why: str) -> None:
        self.armed = False
        self.takeoff_alt_m = None
        self.vn = self.ve = self.vd = 0.0
        self._text(R.MAV_SEVERITY_INFO, "Disarming motors")
        self.stats.extra[f"disarm_{why}"] = self.stats.extra.get(f"disarm_{why}", 0) + 1

    def set_mode(self, name: str, *, reason: str = "gcs") -> int:
        mode = self.flavour.by_name(name)
        if mode is None:
            return FAILED
        return self._try_mode(mode, reason)

    def _set_mode_raw(self, base_mode: float, custom: int, sub: int | None) -> int:
        if self.flavour.name == "px4":
            if sub is None:  # SET_MODE: PX4's receiver unpacks custom_mode into main and sub mode
                custom, sub = (custom >> 16) & 0xFF, (custom >> 24) & 0xFF
            return self._set_mode_px4(int(base_mode), custom, sub)
        if not int(base_mode) & R.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED:
            return UNSUPPORTED
        mode = self.flavour.by_custom(custom)
        if mode is None:
            return FAILED
        return self._try_mode(mode, "gcs")

    def _set_mode_px4(self, base: int, main: int, sub: int) -> int:
        """Commander::handle_command(DO_SET_MODE): AUTO with sub 0 is AUTO.MISSION; a main mode it does not know,
        or no custom flag and no base flag it maps, changes nothing and is ACCEPTED; an unknown AUTO sub mode and
        a refused switch are TEMPORARILY_REJECTED (the sim's FAILED, mapped in `_command`)."""
        if base & R.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED:
            if main == _PX4_MAIN_AUTO and sub == 0:
                sub = 4
            elif main != _PX4_MAIN_AUTO:
                sub = 0
            mode = self.flavour.by_custom(px4_custom(main & 0xFF, sub & 0xFF))
            if mode is None:
                if main == _PX4_MAIN_AUTO:
                    self._text(R.MAV_SEVERITY_CRITICAL, "Unsupported auto mode")
                    return FAILED
                return ACCEPTED
        elif base & R.MAV_MODE_FLAG_AUTO_ENABLED:
            mode = self._mode_or_die("AUTO.MISSION")
        elif base & R.MAV_MODE_FLAG_MANUAL_INPUT_ENABLED:
            name = ("POSCTL" if base & R.MAV_MODE_FLAG_GUIDED_ENABLED
                    else "STABILIZED" if base & R.MAV_MODE_FLAG_STABILIZE_ENABLED else "MANUAL")  # fmt: skip
            mode = self._mode_or_die(name)
        else:
            return ACCEPTED
        return self._try_mode(mode, "gcs")

    def _try_mode(self, mode: Mode, reason: str) -> int:
        if mode is self.fmode:
            return ACCEPTED
        # ArduCopter's Copter::set_mode: `ignore_checks = !motors->armed()` — disarmed, any mode
        # is accepted (the arming checks guard the flight); the position and mission checks apply
        # only to an armed vehicle. PX4's commander checks a mode's requirements either way.
        if self.flavour.name == "ardupilot" and not self.armed:
            self._enter_mode(mode, reason)
            return ACCEPTED
        if mode.needs_position and not self.position_ok:
            self._text(R.MAV_SEVERITY_WARNING, f"Mode change to {mode.name} failed: requires position")
            return FAILED
        if mode.behaviour == "auto":
            items = self._mission()
            if len(items) <= 1:
                self._text(R.MAV_SEVERITY_WARNING, f"Mode change to {mode.name} failed: no mission")
                return FAILED
            first_nav = next((it for it in items[1:] if it.command < _NAV_CMDS_MAX), None)
            if (
                self.flavour.name == "ardupilot"
                and self.armed
                and self.landed
                and (first_nav is None or first_nav.command != R.MAV_CMD_NAV_TAKEOFF)
            ):
                self._text(R.MAV_SEVERITY_CRITICAL, "Auto: Missing Takeoff Cmd")
                return FAILED
        self._enter_mode(mode, reason)
        return ACCEPTED

    def _enter_mode(self, mode: Mode, reason: str) -> None:
        self.fmode = mode
        self.mode_reason = reason
        if mode.behaviour != "guided" and not (mode.behaviour == "hold" and mode.user_takeoff):
            self._abort_takeoff()
        self.target = None
        if mode.behaviour == "rtl":
            self._rtl_start()
        elif mode.behaviour == "auto":
            if self.mission_state != R.MISSION_STATE_ACTIVE or self.mission_seq >= len(self._mission()):
                self._auto_start(1)
            self.item_started = False
            self._send_mission_current()

    def takeoff(self, alt_m: float) -> int:
        if not self.armed or not self.landed or not math.isfinite(alt_m) or alt_m <= 0:
            return FAILED
        if self.flavour.takeoff is not None:
            if self._try_mode(self._mode_or_die(self.flavour.takeoff), "takeoff") != ACCEPTED:
                return FAILED
        elif not self.fmode.user_takeoff:
            return FAILED
        self.takeoff_alt_m = float(alt_m)
        self.landed = False
        return ACCEPTED

    def goto(self, lat_deg: float, lon_deg: float, alt_m: float) -> int:
        if self.fmode.behaviour != "guided":
            return DENIED
        self.target = (lat_deg, lon_deg, max(alt_m, 1.0))
        return ACCEPTED

    # ------------------------------------------------------------------ time
    def step(self, now: float) -> None:
        """Advance to sim time `now` in steps of at most MAX_DT, emitting telemetry as it falls due."""
        while self.now < now - 1e-9:
            dt = min(MAX_DT, now - self.now)
            self.now += dt
            self._physics(dt)
            self._checks()
            if self.sortie is not None and not self.external_control:
                self.sortie.step(self, self.now)
            if self._pending:
                self._poll_pending(self.now)
            if self.missions.upload is not None:
                self.out.extend(self.missions.poll(self.now))
            if self.now >= self.schedule.next_due:
                for msg_id in self.schedule.due(self.now):
                    self._emit(msg_id)
        if self.logs.active:  # a log transfer streams a burst per tick (paused while armed)
            self.out.extend(self.logs.poll(armed=self.armed))
        self._flush_after_ack()  # an arm refused outside a command (the built-in sortie)

    def _checks(self) -> None:
        since_boot = self.now - self.boot_at
        if not self.initialised:
            if since_boot < self.opts.boot_s:
                return
            self.initialised = True
            if self.fmode.name != self.flavour.initial:  # a mode set during BOOT does not survive it
                self._enter_mode(self._mode_or_die(self.flavour.initial), "boot")
            self._text(R.MAV_SEVERITY_INFO, "ArduPilot Ready")
        if self.now >= self._next_timesync and self.flavour.name == "ardupilot":
            self._next_timesync = self.now + TIMESYNC_S
            self._send(R.MAVLink_timesync_message(0, int(since_boot * 1e6) * 1000 + self.sysid))
        if not self.gps_fix and since_boot >= self.opts.gps_fix_s:
            self.gps_fix = True
            self._text(R.MAV_SEVERITY_INFO, "GPS 1: detected u-blox, 3D fix")
        if self.gps_fix and not self.ekf_ok and since_boot >= max(self.opts.ekf_settle_s, self.opts.gps_fix_s):
            self.ekf_ok = True
            self._text(R.MAV_SEVERITY_INFO, "EKF3 IMU0 is using GPS")
            if self.home is None:
                self._send_origin()
                self._set_home(self.lat_deg, self.lon_deg, self.alt_amsl_m)
                if self._is_ap and self.params["MIS_TOTAL"] < 1:
                    self._notify_param("MIS_TOTAL", 1.0)  # AP_Mission writes home as item 0
        if self.now >= self._next_battery_check:  # ArduPilot filters too (BATT_LOW_TIMER)
            self._next_battery_check = self.now + BATTERY_CHECK_S
            self._battery_check()
        if self.armed and self.params["FENCE_ENABLE"]:
            self._fence_check()
        if self.now >= self._next_prearm_check:
            self._prearm_update()
        delay = self.params["DISARM_DELAY"]
        if self.armed and self.landed and delay > 0 and self.now - self.landed_since >= delay:
            self._disarm("auto")

    def _prearm_update(self) -> None:
        """ArduPilot's 1 Hz pre-arm pass: print a failing check every PREARM_DISPLAY_S, or at once when it starts failing.

        Also AP_Terrain's 1 Hz update (disk reads, home, surroundings, mission
        points); its TERRAIN_REQUEST goes out from the stream scheduler instead.
        """
        self._next_prearm_check = self.now + 1.0
        failing = None if self.armed or self.params["ARMING_CHECK"] == 0 else self._prearm_failure()
        failing = failing if failing is not None and failing.startswith("PreArm: ") else None
        if failing is not None and (self._prearm_ok or self.now >= self._next_prearm_text):
            self._next_prearm_text = self.now + PREARM_DISPLAY_S
            self._text(R.MAV_SEVERITY_CRITICAL, failing)
        self._prearm_ok = failing is None
        if self._terrain_in_use and self.params["TERRAIN_ENABLE"]:
            self.terrain.tick(self._terrain_position(), self._terrain_home())

    # ------------------------------------------------------------------ kinematics
    def _physics(self, dt: float) -> None:
        self.consumed_mah += self.current_a * dt / 3.6 * self.opts.battery_drain_scale
        if not self.armed:
            if self.alt_m > 0.0:  # motors off in the air: fall
                self.vd = 10.0
                self.alt_m = max(0.0, self.alt_m - 10.0 * dt)
                self.landed = self.alt_m <= 0.0
            else:
                self.vd = 0.0
            self.vn = self.ve = 0.0
            return
        if self.landed and self.takeoff_alt_m is None and not self._auto_wants_takeoff():
            self.vn = self.ve = self.vd = 0.0
            return
        behaviour = self.fmode.behaviour
        if self.takeoff_alt_m is not None:
            self._climb_to(self.takeoff_alt_m, dt)
            self.vn = self.ve = 0.0
            if self.alt_m >= self.takeoff_alt_m - 0.05:
                self.takeoff_alt_m = None
                if self.flavour.after_takeoff is not None and self.fmode.name == self.flavour.takeoff:
                    self.fmode = self._mode_or_die(self.flavour.after_takeoff)
            return
        if behaviour == "guided" and self.target is not None:
            self._fly_to(*self.target, dt)
        elif behaviour == "rtl":
            self._rtl(dt, in_mission=False)
        elif behaviour == "land":
            self._land(dt)
        elif behaviour == "auto":
            self._auto(dt)
        else:
            self.vn = self.ve = self.vd = 0.0

    def _speed(self) -> float:
        if self.speed_m_s is not None:
            return self.speed_m_s
        return max(self.params["WPNAV_SPEED"] / 100.0, 0.2)

    def _climb_to(self, alt_m: float, dt: float) -> None:
        dz = alt_m - self.alt_m
        rate = (self.params["WPNAV_SPEED_UP"] if dz > 0 else self.params["WPNAV_SPEED_DN"]) / 100.0
        step = max(rate, 0.1) * dt
        if abs(dz) <= step:
            self.alt_m = alt_m
            self.vd = -dz / dt if dt > 0 else 0.0
        else:
            self.alt_m += math.copysign(step, dz)
            self.vd = -math.copysign(max(rate, 0.1), dz)
        if self.alt_m > 0.05:
            self.landed = False

    def _fly_to(self, lat: float, lon: float, alt_m: float | None, dt: float) -> bool:
        """Move toward the point; True once within WPNAV_RADIUS horizontally and 0.5 m vertically."""
        n, e = geo.north_east(self.lat_deg, self.lon_deg, lat, lon)
        dist = math.hypot(n, e)
        step = self._speed() * dt
        if dist <= step:
            self.lat_deg, self.lon_deg = lat, lon
            self.vn = n / dt if dt > 0 else 0.0
            self.ve = e / dt if dt > 0 else 0.0
            dist = 0.0
        else:
            k = step / dist
            self.lat_deg, self.lon_deg = geo.offset(self.lat_deg, self.lon_deg, n * k, e * k)
            self.vn, self.ve = n * k / dt, e * k / dt
            dist -= step
        if dist > 0.5:
            self.heading_deg = geo.bearing_deg(n, e)
        if alt_m is not None:
            self._climb_to(alt_m, dt)
        else:
            self.vd = 0.0
        radius = max(self.params["WPNAV_RADIUS"] / 100.0, 0.1)
        return dist <= radius and (alt_m is None or abs(alt_m - self.alt_m) < 0.5)

    def _land(self, dt: float, lat: float | None = None, lon: float | None = None) -> bool:
        """Descend (toward lat/lon first when given); True on touchdown."""
        if lat is not None and lon is not None and geo.distance_m(self.lat_deg, self.lon_deg, lat, lon) > 0.5:
            self._fly_to(lat, lon, None, dt)
            return False
        self.vn = self.ve = 0.0
        high = self.params["LAND_SPEED_HIGH"] or self.params["WPNAV_SPEED_DN"]
        rate = (high if self.alt_m > 10.0 else self.params["LAND_SPEED"]) / 100.0
        self.vd = max(rate, 0.1)
        self.alt_m = max(0.0, self.alt_m - self.vd * dt)
        if self.alt_m <= 0.0:
            self.vd = 0.0
            self.landed = True
            self.landed_since = self.now
            if self.armed:
                self._disarm("landed")
            return True
        return False

    def _descending_to_land(self) -> bool:
        b = self.fmode.behaviour
        if b == "land":
            return True
        if b == "rtl" and self.rtl_phase == "land":
            return True
        if b == "auto":
            items = self._mission()
            if 0 < self.mission_seq < len(items):
                cmd = items[self.mission_seq].command
                if cmd == R.MAV_CMD_NAV_LAND:
                    return True
                if cmd == R.MAV_CMD_NAV_RETURN_TO_LAUNCH and self.rtl_phase == "land":
                    return True
        return False

    # ------------------------------------------------------------------ RTL
    def _rtl_start(self) -> None:
        rtl_alt = self.params["RTL_ALT"] / 100.0
        if self.params["FENCE_ENABLE"] and int(self.params["FENCE_TYPE"]) & 1:
            rtl_alt = min(rtl_alt, self.params["FENCE_ALT_MAX"] - max(self.params["FENCE_MARGIN"], 1.0))
        self.rtl_alt_m = max(self.alt_m, rtl_alt, 1.0)
        self.rtl_phase = "land" if self.landed or self.home is None else "climb"

    def _rtl(self, dt: float, *, in_mission: bool) -> bool:
        """One step of return-to-launch; True on touchdown."""
        home = self.home
        if self.rtl_phase == "climb":
            self._climb_to(self.rtl_alt_m, dt)
            self.vn = self.ve = 0.0
            if self.alt_m >= self.rtl_alt_m - 0.05:
                self.rtl_phase = "return"
            return False
        if self.rtl_phase == "return" and home is not None:
            if self._fly_to(home[0], home[1], None, dt) and geo.distance_m(self.lat_deg, self.lon_deg, home[0], home[1]) < 0.5:
                self.rtl_phase = "loiter"
                self.rtl_wait_until = self.now + self.params["RTL_LOIT_TIME"] / 1000.0
            return False
        if self.rtl_phase == "loiter":
            self.vn = self.ve = self.vd = 0.0
            if self.now >= self.rtl_wait_until:
                self.rtl_phase = "land"
            return False
        final = self.params["RTL_ALT_FINAL"] / 100.0
        if final > 0 and not in_mission:
            self._climb_to(final, dt)
            return False
        return self._land(dt)

    # ------------------------------------------------------------------ AUTO
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

    def _auto_start(self, seq: int) -> None:
        self.mission_seq = seq
        self.item_started = False
        self.item_hold_until = None
        self.mission_state = R.MISSION_STATE_ACTIVE

    def _set_mission_current(self, seq: int) -> bool:
        if not 0 < seq < len(self._mission()):
            return False
        self.mission_seq = seq
        self.item_started = False
        self.item_hold_until = None
        if self.mission_state == R.MISSION_STATE_COMPLETE:
            self.mission_state = R.MISSION_STATE_ACTIVE
        return True

    def _auto_wants_takeoff(self) -> bool:
        if self.fmode.behaviour != "auto" or self.mission_state != R.MISSION_STATE_ACTIVE:
            return False
        items = self._mission()
        return 0 < self.mission_seq < len(items) and items[self.mission_seq].command == R.MAV_CMD_NAV_TAKEOFF

    def _item_alt(self, item: SimMissionItem) -> float:
        return self._rel_alt(item.z, item.frame)

    def _rel_alt(self, z: float, frame: int) -> float:
        if frame in _GLOBAL_AMSL_FRAMES:
            base = self.home[2] if self.home is not None else self.ground_amsl_m
            return z - base
        return z

    def _auto(self, dt: float) -> None:
        # ArduPilot keeps one "item reached" slot that its telemetry sends later: a
        # navigation item followed at once by DO_ items is reported as the last DO_
        # item's seq only (MISSION_ITEM_REACHED coalescing, seen on a real ArduCopter).
        items = self._mission()
        reached: int | None = None
        for _ in range(len(items)):  # DO_ items complete instantly; bounded by the list
            if self.mission_state != R.MISSION_STATE_ACTIVE or not 0 < self.mission_seq < len(items):
                self.vn = self.ve = self.vd = 0.0
                break
            item = items[self.mission_seq]
            is_nav = item.command < _NAV_CMDS_MAX
            if is_nav and reached is not None:
                break  # one navigation item per step
            if not self.item_started:
                self.item_started = True
                self.item_hold_until = None
                if item.command == R.MAV_CMD_NAV_RETURN_TO_LAUNCH:
                    self._rtl_start()
            done = self._run_item(item, dt)
            if not done:
                break
            if is_nav:
                self._text(R.MAV_SEVERITY_INFO, f"Reached command #{item.seq}")
                reached = item.seq
            elif reached is not None and self.flavour.name == "ardupilot":
                reached = item.seq
            self._advance(len(items))
        if reached is not None:
            self._reached(reached)

    def _run_item(self, item: SimMissionItem, dt: float) -> bool:
        cmd = item.command
        if cmd >= _NAV_CMDS_MAX:  # DO_/CONDITION_ commands
            if cmd == R.MAV_CMD_DO_CHANGE_SPEED and item.param2 > 0:
                self.speed_m_s = float(item.param2)
            return True
        if cmd == R.MAV_CMD_NAV_TAKEOFF:
            alt = max(self._item_alt(item), 1.0)
            if self.alt_m >= alt - 0.05:
                return True
            self._climb_to(alt, dt)
            self.vn = self.ve = 0.0
            return False
        if self.landed:  # ArduPilot will not leave the ground without a takeoff item
            self.vn = self.ve = self.vd = 0.0
            return False
        if cmd == R.MAV_CMD_NAV_LAND:
            lat = item.lat_deg if item.x or item.y else None
            lon = item.lon_deg if item.x or item.y else None
            return self._land(dt, lat, lon)
        if cmd == R.MAV_CMD_NAV_RETURN_TO_LAUNCH:
            return self._rtl(dt, in_mission=True)
        if cmd in (
            R.MAV_CMD_NAV_WAYPOINT,
            R.MAV_CMD_NAV_LOITER_UNLIM,
            R.MAV_CMD_NAV_LOITER_TIME,
            R.MAV_CMD_NAV_LOITER_TURNS,
            R.MAV_CMD_NAV_SPLINE_WAYPOINT,
            R.MAV_CMD_NAV_DELAY,
        ):
            if cmd == R.MAV_CMD_NAV_DELAY:
                arrived = True
                self.vn = self.ve = self.vd = 0.0
            else:
                lat = item.lat_deg if item.x or item.y else self.lat_deg
                lon = item.lon_deg if item.x or item.y else self.lon_deg
                arrived = self._fly_to(lat, lon, self._item_alt(item), dt)
            if not arrived:
                return False
            if cmd == R.MAV_CMD_NAV_LOITER_UNLIM:
                return False
            if self.item_hold_until is None:
                hold = item.param1 if cmd in (R.MAV_CMD_NAV_WAYPOINT, R.MAV_CMD_NAV_LOITER_TIME, R.MAV_CMD_NAV_DELAY) else 10.0
                self.item_hold_until = self.now + max(float(hold), 0.0)
            return self.now >= self.item_hold_until
        return True  # navigation commands the simulator does not model are skipped

    def _reached(self, seq: int) -> None:
        self.reached.append(seq)
        del self.reached[:-1000]
        self._send(R.MAVLink_mission_item_reached_message(seq))

    def _advance(self, count: int) -> None:
        self.item_started = False
        self.item_hold_until = None
        if self.mission_seq + 1 >= count:
            self.mission_state = R.MISSION_STATE_COMPLETE
            self._text(R.MAV_SEVERITY_INFO, "Mission complete")
        else:
            self.mission_seq += 1
        self._send_mission_current()

    # ------------------------------------------------------------------ battery
    def _battery_level(self) -> int:
        """0 fine, 1 low, 2 critical, from BATT_* thresholds (voltage and/or mAh remaining)."""
        v = self.battery_v
        remaining = self.capacity_mah - self.consumed_mah
        p = self.params
        if (p["BATT_CRT_VOLT"] > 0 and v < p["BATT_CRT_VOLT"]) or (p["BATT_CRT_MAH"] > 0 and remaining < p["BATT_CRT_MAH"]):
            return 2
        if (p["BATT_LOW_VOLT"] > 0 and v < p["BATT_LOW_VOLT"]) or (p["BATT_LOW_MAH"] > 0 and remaining < p["BATT_LOW_MAH"]):
            return 1
        return 0

    def _battery_check(self) -> None:
        level = self._battery_level()
        if level <= self.battery_fs:
            return
        self.battery_fs = level
        word = "critical" if level == 2 else "low"
        self._text(
            R.MAV_SEVERITY_CRITICAL,
            f"Battery failsafe: {word} {self.battery_v:.2f}V used {self.consumed_mah:.0f} mAh",
        )
        if not self.armed:
            return
        if self.landed:
            self._disarm("battery_failsafe")
            return
        action = int(self.params["BATT_FS_CRT_ACT" if level == 2 else "BATT_FS_LOW_ACT"])
        self._failsafe_action(action, "battery_failsafe")

    def _failsafe_action(self, action: int, reason: str) -> None:
        """BATT_FS_*_ACT numbering: 0 none, 1 land, 2 RTL, 3 SmartRTL/RTL, 4 SmartRTL/land, 5 terminate."""
        if action == 0:
            return
        if action == 5:
            self._disarm(reason)
            return
        want = self.flavour.land if action in (1, 4) else self.flavour.rtl
        if want == self.flavour.rtl and (self.home is None or not self.position_ok):
            want = self.flavour.land
        if self.fmode.behaviour == "land" or (self.fmode.behaviour == "rtl" and want == self.flavour.rtl):
            return
        self._enter_mode(self._mode_or_die(want), reason)

    # ------------------------------------------------------------------ fence
    def _fence_polygons(self) -> list[list[tuple[float, float]]]:
        polys: list[list[tuple[float, float]]] = []
        current: list[tuple[float, float]] = []
        want = 0
        for it in self.missions.items(FENCE):
            if it.command != R.MAV_CMD_NAV_FENCE_POLYGON_VERTEX_INCLUSION:
                continue
            if not current:
                want = max(round(it.param1), 0)
            current.append((it.lat_deg, it.lon_deg))
            if len(current) >= want:
                polys.append(current)
                current = []
        return polys

    def _fence_breach(self) -> int:
        p = self.params
        ftype = int(p["FENCE_TYPE"])
        if ftype & 1 and self.alt_m > p["FENCE_ALT_MAX"]:
            return int(R.FENCE_BREACH_MAXALT)
        home = self.home
        if ftype & 2 and home is not None and geo.distance_m(home[0], home[1], self.lat_deg, self.lon_deg) > p["FENCE_RADIUS"]:
            return int(R.FENCE_BREACH_BOUNDARY)
        if ftype & 4:
            for poly in self._fence_polygons():
                if not geo.inside_polygon(self.lat_deg, self.lon_deg, poly):
                    return int(R.FENCE_BREACH_BOUNDARY)
        return int(R.FENCE_BREACH_NONE)

    def _fence_check(self) -> None:
        breach = self._fence_breach()
        f = self.fence
        if breach == f.breach_type:
            return
        f.breach_type = breach
        if breach:
            f.breach_count += 1
            f.breach_time_ms = self.boot_ms
            self._text(R.MAV_SEVERITY_CRITICAL, "Fence breached")
            if not self.landed:
                action = int(self.params["FENCE_ACTION"])
                if action in (1, 3, 6):
                    self._failsafe_action(2, "fence_breach")
                elif action in (2, 4, 5):
                    self._failsafe_action(1, "fence_breach")
        self._emit(streams.FENCE_STATUS)

    # ------------------------------------------------------------------ telemetry
    def _set_home(self, lat: float, lon: float, amsl: float) -> None:
        self.home = (lat, lon, amsl)
        self.missions.home_item = SimMissionItem(
            seq=0, frame=R.MAV_FRAME_GLOBAL, command=R.MAV_CMD_NAV_WAYPOINT, x=round(lat * 1e7), y=round(lon * 1e7), z=amsl
        )
        self._send(self._home_position())

    def _send_origin(self) -> None:
        if self.flavour.name == "ardupilot":
            self._send(R.MAVLink_gps_global_origin_message(
                round(self.lat_deg * 1e7), round(self.lon_deg * 1e7), round(self.alt_amsl_m * 1000), self._unix_us(),
            ))  # fmt: skip

    def _home_position(self) -> Any:
        h = self.home or (0.0, 0.0, 0.0)
        return R.MAVLink_home_position_message(
            round(h[0] * 1e7), round(h[1] * 1e7), round(h[2] * 1000), 0.0, 0.0, 0.0, [1.0, 0.0, 0.0, 0.0], 0.0, 0.0, 0.0,
            self._unix_us(),
        )  # fmt: skip

    def _unix_us(self) -> int:
        return int((self.opts.epoch_unix_s + self.now) * 1e6) if self.gps_fix else 0

    def _send_mission_current(self) -> None:
        self._emit(streams.MISSION_CURRENT)

    def _send_requested(self, msg_id: int) -> None:
        if msg_id == R.MAVLINK_MSG_ID_AUTOPILOT_VERSION:
            self._send(self._autopilot_version())
        else:
            self._emit(msg_id, force=True)

    def _autopilot_version(self) -> Any:
        maj, mnr, pat = self.flavour.version
        caps = (
            R.MAV_PROTOCOL_CAPABILITY_MISSION_FLOAT
            | R.MAV_PROTOCOL_CAPABILITY_PARAM_FLOAT
            | R.MAV_PROTOCOL_CAPABILITY_MISSION_INT
            | R.MAV_PROTOCOL_CAPABILITY_COMMAND_INT
            | R.MAV_PROTOCOL_CAPABILITY_SET_POSITION_TARGET_GLOBAL_INT
            | R.MAV_PROTOCOL_CAPABILITY_MAVLINK2
            | R.MAV_PROTOCOL_CAPABILITY_MISSION_FENCE
            | R.MAV_PROTOCOL_CAPABILITY_MISSION_RALLY
        )
        # the recorded ArduCopter master reports type DEV (0): flight_sw_version 0x04070000
        kind = R.FIRMWARE_VERSION_TYPE_DEV if self.flavour.name == "ardupilot" else R.FIRMWARE_VERSION_TYPE_OFFICIAL
        sw = (maj << 24) | (mnr << 16) | (pat << 8) | kind
        uid = 0x4D4A_5349_0000_0000 | (self.opts.sysid & 0xFFFF_FFFF)
        uid2 = list(f"mavjet-sim-{self.opts.sysid:07d}".encode()[:18].ljust(18, b"\0"))
        return R.MAVLink_autopilot_version_message(
            caps, sw, 0, 0, 0, list(b"6d0b0a1c"), [0] * 8, [0] * 8, 0x1209, 0x5740, uid, uid2
        )

    def _emit(self, msg_id: int, *, force: bool = False) -> None:
        emitter = _EMITTERS.get(msg_id)
        if emitter is not None:
            emitter(self, force)

    # One method per streamed message: the tick loop calls these tens of thousands of
    # times a second at load-test sizes, so they avoid properties and module lookups.
    def _e_global_position_int(self, force: bool) -> None:
        alt = self.alt_m
        self.out.append((_P_GPI, (
            int((self.now - self.boot_at) * 1000), round(self.lat_deg * 1e7), round(self.lon_deg * 1e7),
            round((self.ground_amsl_m + alt) * 1000), round(alt * 1000), round(self.vn * 100), round(self.ve * 100),
            round(self.vd * 100), round(self.heading_deg * 100) % 36000,
        )))  # fmt: skip

    def _e_attitude(self, force: bool) -> None:
        gs = math.hypot(self.vn, self.ve)
        pitch = -0.02 * (gs if gs < 15.0 else 15.0)  # nose down when moving, roughly
        yaw = math.radians(self.heading_deg)
        if yaw > math.pi:
            yaw -= 2 * math.pi
        self.out.append((_P_ATT, (int((self.now - self.boot_at) * 1000), self.roll, pitch, yaw, 0.0, 0.0, 0.0)))

    def _e_heartbeat(self, force: bool) -> None:
        self.out.append((enc.HEARTBEAT, self._heartbeat_values()))

    def _e_sys_status(self, force: bool) -> None:
        health = _SENSORS
        if not self.gps_fix:
            health &= ~R.MAV_SYS_STATUS_SENSOR_GPS
        if not self.ekf_ok:
            health &= ~(R.MAV_SYS_STATUS_AHRS | R.MAV_SYS_STATUS_PREARM_CHECK)
        if self.battery_fs:
            health &= ~R.MAV_SYS_STATUS_SENSOR_BATTERY
        self.out.append((enc.SYS_STATUS, (
            _SENSORS, _SENSORS, health, 180, round(self.battery_v * 1000), round(self.current_a * 100),
            round(self.battery_pct), 0, self.stats.bad_frames_in & 0xFFFF, 0, 0, 0, 0, 0, 0, 0,
        )))  # fmt: skip

    def _e_gps_raw_int(self, force: bool) -> None:
        fix = self.gps_fix
        amsl_mm = round((self.ground_amsl_m + self.alt_m) * 1000)
        self.out.append((enc.GPS_RAW_INT, (
            self._unix_us(), 3 if fix else 1, round(self.lat_deg * 1e7), round(self.lon_deg * 1e7), amsl_mm,
            121 if fix else 9999, 200 if fix else 9999, round(math.hypot(self.vn, self.ve) * 100),
            round(self.heading_deg * 100) % 36000, 12 if fix else 0, amsl_mm + 22_000, 300, 500, 200, 0, 0,
        )))  # fmt: skip

    def _e_vfr_hud(self, force: bool) -> None:
        gs = math.hypot(self.vn, self.ve)
        throttle = 0 if not self.armed else (12 if self.landed else 48)
        self.out.append((enc.VFR_HUD, (
            gs, gs, round(self.heading_deg) % 360, throttle, self.ground_amsl_m + self.alt_m, -self.vd,
        )))  # fmt: skip

    def _e_extended_sys_state(self, force: bool) -> None:
        # ArduCopter reports vtol_state MAV_VTOL_STATE_MC (3); PX4 leaves a non-VTOL UNDEFINED (0)
        self.out.append((enc.EXTENDED_SYS_STATE, (self._vtol_state, self.landed_state)))

    def _e_terrain_request(self, force: bool) -> None:
        if self.params["TERRAIN_ENABLE"] and self.flavour.name == "ardupilot":
            self._terrain_in_use = True
            msg = self.terrain.request(self._terrain_position(), self.now)
            if msg is not None:
                self.out.append(msg)

    def _e_terrain_report(self, force: bool) -> None:
        pos = self._terrain_position()
        if self.params["TERRAIN_ENABLE"] and pos is not None and self.flavour.name == "ardupilot":
            self._terrain_in_use = True
            self.out.append(self.terrain.report(*pos, home=self._terrain_home(), rel_alt_m=self.alt_m))

    def _e_system_time(self, force: bool) -> None:
        self.out.append((enc.SYSTEM_TIME, (self._unix_us(), int((self.now - self.boot_at) * 1000))))

    def _e_battery_status(self, force: bool) -> None:
        mv = round(self.battery_v * 1000)
        charge = (
            R.MAV_BATTERY_CHARGE_STATE_OK,
            R.MAV_BATTERY_CHARGE_STATE_LOW,
            R.MAV_BATTERY_CHARGE_STATE_CRITICAL,
        )[self._battery_level()]
        self.out.append(R.MAVLink_battery_status_message(
            0, R.MAV_BATTERY_FUNCTION_ALL, R.MAV_BATTERY_TYPE_LIPO, 32767, [mv] + [65535] * 9,
            round(self.current_a * 100), round(self.consumed_mah), round(self.consumed_mah * self.battery_v * 0.036),
            round(self.battery_pct), 0, charge, [0, 0, 0, 0], 0, 0,
        ))  # fmt: skip

    def _e_home_position(self, force: bool) -> None:
        if self.home is not None:
            self.out.append(self._home_position())

    def _e_mission_current(self, force: bool) -> None:
        n = len(self._mission())  # with the home (or PX4's placeholder)
        state = self.mission_state if n > 1 else R.MISSION_STATE_NO_MISSION
        in_mission = 1 if self.fmode.behaviour == "auto" else 2
        self.out.append((enc.MISSION_CURRENT, (self.mission_seq - self._seq_offset, n - 1, state, in_mission)))

    def _e_fence_status(self, force: bool) -> None:
        f = self.fence
        if self.params["FENCE_ENABLE"] or force or f.breach_count:
            self.out.append((enc.FENCE_STATUS, (
                1 if f.breach_type else 0, f.breach_count, f.breach_type, f.breach_time_ms, R.FENCE_MITIGATE_NONE,
            )))  # fmt: skip

    def _heartbeat_values(self) -> tuple[int, ...]:
        if self.flavour.name == "ardupilot":
            return self._heartbeat_ardupilot()
        # PX4's HEARTBEAT stream from vehicle_control_mode (mode_util::getVehicleControlMode, multicopter):
        # manual modes manual+attitude, AUTO.* auto (with stabilize and guided), OFFBOARD none without setpoints;
        # system_status from the arming state only: ACTIVE (CRITICAL in failsafe) armed, STANDBY disarmed.
        base = R.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED
        main = (self.fmode.custom_mode >> 16) & 0xFF
        if main in _PX4_MANUAL_MAINS:
            base |= R.MAV_MODE_FLAG_MANUAL_INPUT_ENABLED | R.MAV_MODE_FLAG_STABILIZE_ENABLED
        elif main == _PX4_MAIN_AUTO:
            base |= R.MAV_MODE_FLAG_AUTO_ENABLED | R.MAV_MODE_FLAG_STABILIZE_ENABLED | R.MAV_MODE_FLAG_GUIDED_ENABLED
        if self.armed:
            base |= R.MAV_MODE_FLAG_SAFETY_ARMED
            status = R.MAV_STATE_CRITICAL if self.failsafe else R.MAV_STATE_ACTIVE
        else:
            status = R.MAV_STATE_STANDBY
        return (R.MAV_TYPE_QUADROTOR, self.flavour.autopilot, base, self.fmode.custom_mode, status, 3)

    def _heartbeat_ardupilot(self) -> tuple[int, ...]:
        """GCS_MAVLINK_Copter::base_mode and vehicle_system_status, as a real ArduCopter reports them."""
        name = self.fmode.name
        if not self.initialised:
            base, status = _AP_BOOT_BASE_MODE, R.MAV_STATE_BOOT
        else:
            base = (R.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED | R.MAV_MODE_FLAG_STABILIZE_ENABLED
                    | R.MAV_MODE_FLAG_MANUAL_INPUT_ENABLED)  # fmt: skip
            if name in _AP_GUIDED_ALWAYS or (self.armed and name in _AP_GUIDED_ARMED):
                base |= R.MAV_MODE_FLAG_GUIDED_ENABLED
            if self.armed:
                base |= R.MAV_MODE_FLAG_SAFETY_ARMED
            # failsafe first, then land_complete: armed on the ground is still STANDBY, ACTIVE once flying
            if self.failsafe:
                status = R.MAV_STATE_CRITICAL
            elif self.landed:
                status = R.MAV_STATE_STANDBY
            else:
                status = R.MAV_STATE_ACTIVE
        return (R.MAV_TYPE_QUADROTOR, self.flavour.autopilot, base, self.fmode.custom_mode, status, 3)


def _fence_total(items: list[SimMissionItem]) -> int:
    """FENCE_TOTAL as ArduPilot's fence store counts it: one header per polygon, its vertices, one per
    circle, and an end marker (a 4-vertex inclusion polygon and one circle read FENCE_TOTAL 7)."""
    if not items:
        return 0
    polygons = 0
    left = 0
    for it in items:
        if it.command in (R.MAV_CMD_NAV_FENCE_POLYGON_VERTEX_INCLUSION, R.MAV_CMD_NAV_FENCE_POLYGON_VERTEX_EXCLUSION):
            if left <= 0:
                polygons += 1
                left = max(round(it.param1), 1)
            left -= 1
    return len(items) + polygons + 1


def _param_name(raw: Any) -> str:
    if isinstance(raw, bytes):
        raw = raw.decode("ascii", "replace")
    return str(raw).split("\0", 1)[0]


_HANDLERS: Final[dict[str, Any]] = {
    "HEARTBEAT": VehicleModel._on_heartbeat,
    "TIMESYNC": VehicleModel._on_timesync,
    "REQUEST_DATA_STREAM": VehicleModel._on_request_data_stream,
    "SET_MODE": VehicleModel._on_set_mode,
    "COMMAND_LONG": VehicleModel._on_command_long,
    "COMMAND_INT": VehicleModel._on_command_int,
    "PARAM_REQUEST_LIST": VehicleModel._on_param_request_list,
    "PARAM_REQUEST_READ": VehicleModel._on_param_request_read,
    "PARAM_SET": VehicleModel._on_param_set,
    "MISSION_COUNT": VehicleModel._on_mission_count,
    "MISSION_ITEM_INT": VehicleModel._on_mission_item,
    "MISSION_ITEM": VehicleModel._on_mission_item,
    "MISSION_REQUEST_LIST": VehicleModel._on_mission_request_list,
    "MISSION_REQUEST_INT": VehicleModel._on_mission_request,
    "MISSION_REQUEST": VehicleModel._on_mission_request,
    "MISSION_CLEAR_ALL": VehicleModel._on_mission_clear_all,
    "MISSION_SET_CURRENT": VehicleModel._on_mission_set_current,
    "MISSION_ACK": VehicleModel._on_mission_ack,
    "TERRAIN_DATA": VehicleModel._on_terrain_data,
    "TERRAIN_CHECK": VehicleModel._on_terrain_check,
    "LOG_REQUEST_LIST": VehicleModel._on_log_message,
    "LOG_REQUEST_DATA": VehicleModel._on_log_message,
    "LOG_REQUEST_END": VehicleModel._on_log_message,
}

_P_GPI: Final = enc.GLOBAL_POSITION_INT
_P_ATT: Final = enc.ATTITUDE

_EMITTERS: Final[dict[int, Any]] = {
    streams.GLOBAL_POSITION_INT: VehicleModel._e_global_position_int,
    streams.ATTITUDE: VehicleModel._e_attitude,
    streams.HEARTBEAT: VehicleModel._e_heartbeat,
    streams.SYS_STATUS: VehicleModel._e_sys_status,
    streams.GPS_RAW_INT: VehicleModel._e_gps_raw_int,
    streams.VFR_HUD: VehicleModel._e_vfr_hud,
    streams.EXTENDED_SYS_STATE: VehicleModel._e_extended_sys_state,
    streams.SYSTEM_TIME: VehicleModel._e_system_time,
    streams.TERRAIN_REQUEST: VehicleModel._e_terrain_request,
    streams.TERRAIN_REPORT: VehicleModel._e_terrain_report,
    streams.BATTERY_STATUS: VehicleModel._e_battery_status,
    streams.HOME_POSITION: VehicleModel._e_home_position,
    streams.MISSION_CURRENT: VehicleModel._e_mission_current,
    streams.FENCE_STATUS: VehicleModel._e_fence_status,
}

_COMMANDS: Final[dict[int, Any]] = {
    R.MAV_CMD_COMPONENT_ARM_DISARM: VehicleModel._cmd_arm_disarm,
    R.MAV_CMD_NAV_TAKEOFF: VehicleModel._cmd_takeoff,
    R.MAV_CMD_NAV_LAND: VehicleModel._cmd_land,
    R.MAV_CMD_NAV_RETURN_TO_LAUNCH: VehicleModel._cmd_rtl,
    R.MAV_CMD_DO_SET_MODE: VehicleModel._cmd_do_set_mode,
    R.MAV_CMD_DO_REPOSITION: VehicleModel._cmd_reposition,
    R.MAV_CMD_MISSION_START: VehicleModel._cmd_mission_start,
    R.MAV_CMD_PREFLIGHT_REBOOT_SHUTDOWN: VehicleModel._cmd_reboot,
    R.MAV_CMD_SET_MESSAGE_INTERVAL: VehicleModel._cmd_set_message_interval,
    R.MAV_CMD_GET_MESSAGE_INTERVAL: VehicleModel._cmd_get_message_interval,
    R.MAV_CMD_REQUEST_MESSAGE: VehicleModel._cmd_request_message,
    R.MAV_CMD_REQUEST_AUTOPILOT_CAPABILITIES: VehicleModel._cmd_capabilities,
    R.MAV_CMD_DO_SET_MISSION_CURRENT: VehicleModel._cmd_set_mission_current,
    R.MAV_CMD_DO_CHANGE_SPEED: VehicleModel._cmd_change_speed,
    R.MAV_CMD_DO_SET_HOME: VehicleModel._cmd_set_home,
    R.MAV_CMD_DO_FENCE_ENABLE: VehicleModel._cmd_fence_enable,
    R.MAV_CMD_GET_HOME_POSITION: VehicleModel._cmd_get_home,
}

# commands that take the vehicle out of the built-in sortie's hands
_FLIGHT_COMMANDS: Final = frozenset(
    {
        R.MAV_CMD_COMPONENT_ARM_DISARM,
        R.MAV_CMD_NAV_TAKEOFF,
        R.MAV_CMD_NAV_LAND,
        R.MAV_CMD_NAV_RETURN_TO_LAUNCH,
        R.MAV_CMD_DO_SET_MODE,
        R.MAV_CMD_DO_REPOSITION,
        R.MAV_CMD_MISSION_START,
    }
)
