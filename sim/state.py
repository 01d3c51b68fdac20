"""The state of one simulated vehicle: plain data, the queries over it, and its outbox.

`VehicleState` is everything one vehicle knows, in one dataclass whose
fields are all public (a field is read and written by the step modules of
every concern, so none is private to one). Concerns with a state of their
own have their own dataclass inside it: the command desk (`CommandDesk`),
the fence (`FenceState`), counters (`Stats`); the stream schedule, the
mission lists, terrain and logs are their own sans-IO objects
(`mavjet.sim.streams`, `missions`, `terrain`, `logs`).

The step functions (`mavjet.sim.telemetry`, `flight`, `control`, `failsafe`,
`lifecycle`, `stores`, `commands`) take a `VehicleState` and the inputs of
the step (sim time, a message, a command's parameters), change the state,
and put their effects in the state's outbox: `out`, the MAVLink messages to
send in order (a pymavlink message, or `(Packer, values)` for hot
telemetry), and `reboot_pending`, a reboot to start once they are sent. The
outbox is drained by the I/O shell (`mavjet.sim.vehicle`), never read by
the steps. Effects are appended rather than returned because a step
produces them at many depths (a command arms, which sets home, which sends
HOME_POSITION) and their order is what the wire shows; at load-test sizes
the tick path cannot afford a list per call either.

This module imports no step module: the queries here (mode, battery,
landed state, the mission as flown) only read the state.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final

from mavjet.sim import params, streams
from mavjet.sim.consts import ACCEPTED, R
from mavjet.sim.logs import LogServer, default_logs
from mavjet.sim.missionitem import SimMissionItem
from mavjet.sim.missions import FENCE, MISSION, MissionServer
from mavjet.sim.modes import Mode, SimFlavour
from mavjet.sim.terrain import TerrainServer

COMP_AUTOPILOT: Final = 1
NAV_ITEM: Final[int] = R.MAV_CMD_NAV_WAYPOINT

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


@dataclass(slots=True)
class FenceState:
    breach_type: int = 0  # FENCE_BREACH_*
    breach_count: int = 0
    breach_time_ms: int = 0


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
class Sent:
    """The answer to a command, kept to answer its retransmissions the same way."""

    params: tuple[float, ...]
    wall: float
    result: int
    progress: int = 0


@dataclass(slots=True)
class Pending:
    """A command answered IN_PROGRESS whose final answer is still to come."""

    command: int
    partner: tuple[int, int]
    due: float | None  # sim time of the final answer, None: decided by flight state (takeoff)
    result: int = ACCEPTED
    last_progress: float = 0.0


@dataclass(slots=True)
class CommandDesk:
    """What the command desk (`mavjet.sim.commands`) remembers between commands."""

    sent: dict[int, Sent] = field(default_factory=dict)  # MAV_CMD -> its last answer (retransmissions)
    pending: list[Pending] = field(default_factory=list)  # answered IN_PROGRESS, final ACK to come
    forced: dict[int, deque[int]] = field(default_factory=dict)  # MAV_CMD -> results `reject_next` holds
    after_ack: list[Any] = field(default_factory=list)  # said right after a COMMAND_ACK ("Arm: ..." reasons)


def _statustexts() -> deque[tuple[int, str]]:
    return deque(maxlen=200)


@dataclass(eq=False)
class VehicleState:
    """Flight state, autopilot state and stores of one simulated vehicle (see the module's doc).

    Built from its options; `mavjet.sim.lifecycle.power_on` then sets what a
    boot (or a reboot) resets. Fields without a comment are what their name says.
    """

    opts: VehicleOptions
    # identity
    flavour: SimFlavour = field(init=False)
    sysid: int = field(init=False)
    compid: int = COMP_AUTOPILOT
    is_ap: bool = field(init=False)  # the ArduPilot flavour (its rules differ from PX4's in many places)
    vtol_state: int = field(init=False)  # EXTENDED_SYS_STATE: ArduCopter says MC (3), PX4 UNDEFINED (0)
    # stores and protocol servers (sans-IO objects of their own)
    params: dict[str, float] = field(init=False)
    missions: MissionServer = field(init=False)
    terrain: TerrainServer = field(init=False)
    logs: LogServer = field(init=False)
    schedule: streams.Schedule = field(init=False)
    # The terrain cache's 1 Hz work runs once terrain is asked about (a stream, a TERRAIN_CHECK, mission
    # points): nothing is visible before that, and a load test's fleet does not pay for it.
    terrain_in_use: bool = field(init=False)
    terrain_required: bool = False  # the mission holds terrain-frame items (set when a mission is committed)
    # the outbox and the records a test reads
    out: list[Any] = field(default_factory=list)
    reboot_pending: bool = False  # a reboot to start once `out` is sent (an effect, like `out`)
    executions: list[ExecutedCommand] = field(default_factory=list)
    statustexts: deque[tuple[int, str]] = field(default_factory=_statustexts)
    reached: list[int] = field(default_factory=list)  # MISSION_ITEM_REACHED seqs, in order (bounded)
    stats: Stats = field(default_factory=Stats)
    desk: CommandDesk = field(default_factory=CommandDesk)
    rng: random.Random = field(init=False)
    # position and motion (kept over a reboot)
    ground_amsl_m: float = field(init=False)
    lat_deg: float = field(init=False)
    lon_deg: float = field(init=False)
    alt_m: float = 0.0  # above home/ground
    heading_deg: float = field(init=False)
    vn: float = 0.0
    ve: float = 0.0
    vd: float = 0.0
    roll: float = 0.0
    pitch: float = 0.0
    consumed_mah: float = 0.0
    # who flies it
    sortie: Any = None  # mavjet.sim.sortie.Sortie when flying the built-in sortie
    external_control: bool = False  # a ground station has commanded flight: the sortie steps aside
    reboots: int = 0
    # boot (reset by lifecycle.power_on)
    now: float = 0.0
    boot_at: float = 0.0
    initialised: bool = False  # ArduPilot: BOOT is over ("ArduPilot Ready")
    gps_fix: bool = False
    ekf_ok: bool = False
    home: tuple[float, float, float] | None = None
    # arming and mode
    armed: bool = False
    fmode: Mode = field(init=False)
    mode_reason: str = "boot"
    landed: bool = True
    landed_since: float = 0.0
    # guided flight and RTL
    takeoff_alt_m: float | None = None
    target: tuple[float, float, float] | None = None
    speed_m_s: float | None = None
    rtl_phase: str = ""
    rtl_alt_m: float = 0.0
    rtl_wait_until: float = 0.0
    # AUTO: `mission_seq` indexes `mission_view(s)` (home, or PX4's placeholder, at 0)
    mission_seq: int = 1
    mission_state: int = R.MISSION_STATE_NOT_STARTED
    item_started: bool = False
    item_hold_until: float | None = None
    # failsafes
    battery_fs: int = 0  # 0 none, 1 low, 2 critical
    fence: FenceState = field(default_factory=FenceState)
    # periodic work (sim times)
    next_timesync: float = 0.0
    next_battery_check: float = 0.0
    next_prearm_text: float = 0.0
    prearm_ok: bool = False  # a check that starts failing after passing is printed at once
    next_prearm_check: float = 0.0

    def __post_init__(self) -> None:
        opts = self.opts
        ardupilot = opts.flavour.name == "ardupilot"
        self.flavour = opts.flavour
        self.sysid = opts.sysid
        self.is_ap = ardupilot
        self.vtol_state = R.MAV_VTOL_STATE_MC if ardupilot else R.MAV_VTOL_STATE_UNDEFINED
        self.params = params.defaults(opts.sysid)
        self.missions = MissionServer(ardupilot=ardupilot)
        self.terrain = TerrainServer(preloaded=opts.terrain_preloaded, ground_amsl_m=opts.ground_amsl_m)
        self.logs = LogServer(partial(default_logs, opts.sysid))  # dataflash logs served by the log protocol
        # ArduPilot sends a stream's messages of one interval together; PX4 times each on its own.
        self.schedule = streams.Schedule(bucketed=ardupilot)
        self.terrain_in_use = opts.terrain_preloaded
        self.rng = random.Random(opts.seed)
        self.ground_amsl_m = opts.ground_amsl_m
        self.lat_deg = opts.lat_deg
        self.lon_deg = opts.lon_deg
        self.heading_deg = opts.heading_deg
        self.fmode = mode_named(self, self.flavour.initial)

    # ------------------------------------------------------------------ derived (read-only)
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
        if descending_to_land(self):
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


# ---------------------------------------------------------------------- queries
def mode_named(s: VehicleState, name: str) -> Mode:
    """The flavour's mode `name`; a name the flavour lacks is a bug of the simulator, not of its input."""
    m = s.flavour.by_name(name)
    if m is None:
        raise ValueError(f"flavour {s.flavour.name} has no mode {name}")
    return m


def mission_view(s: VehicleState) -> list[SimMissionItem]:
    """The MISSION list indexed as ArduPilot's, home at 0: PX4's has no home, so a placeholder stands there
    (its items keep their own seq, which MISSION_ITEM_REACHED reports); see `seq_offset`."""
    items = s.missions.items(MISSION)
    if s.missions.home_at_seq0:
        return items
    return [SimMissionItem(seq=0, frame=R.MAV_FRAME_GLOBAL, command=NAV_ITEM), *items]


def seq_offset(s: VehicleState) -> int:
    """`mission_seq` (index into `mission_view`) minus the seq on the wire: 1 on PX4, 0 on ArduPilot."""
    return 0 if s.missions.home_at_seq0 else 1


def descending_to_land(s: VehicleState) -> bool:
    b = s.fmode.behaviour
    if b == "land":
        return True
    if b == "rtl" and s.rtl_phase == "land":
        return True
    if b == "auto":
        items = mission_view(s)
        if 0 < s.mission_seq < len(items):
            cmd = items[s.mission_seq].command
            if cmd == R.MAV_CMD_NAV_LAND:
                return True
            if cmd == R.MAV_CMD_NAV_RETURN_TO_LAUNCH and s.rtl_phase == "land":
                return True
    return False


# ---------------------------------------------------------------------- the outbox
def send(s: VehicleState, msg: Any) -> None:
    s.out.append(msg)


def text(s: VehicleState, severity: int, txt: str) -> None:
    """A STATUSTEXT, also kept in `statustexts` for tests."""
    s.statustexts.append((severity, txt))
    s.out.append(R.MAVLink_statustext_message(severity, txt.encode()[:50], 0, 0))


def ack(s: VehicleState, command: int, result: int, partner: tuple[int, int], progress: int = 0) -> None:
    s.out.append(R.MAVLink_command_ack_message(command, result, progress, 0, partner[0], partner[1]))
