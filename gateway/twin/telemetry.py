"""Telemetry model of one vehicle: MAVLink messages in, state channels and events out.

Pure and synchronous (no I/O, no asyncio): the gateway's hot path calls
`update()` for every message, so it is written for speed, and every rule in
here is unit-tested by feeding pymavlink messages.

Times: every sample's and event's time is `recv_ns`, the gateway's clock
(gateway/twin/clock.py) when the batch holding the message arrived, never the
vehicle's clock, so ages computed by readers are true ages. Channels fed by a
message carrying the autopilot's boot time keep it as `time_boot_ms`.

Status text follows gateway/twin/statustext.py: repeats collapsed per window,
"Reached command #N" folded into MISSION_ITEM_REACHED. Repeats still reach
in-gateway subscribers as `internal` events (a command waiting for the
reason of a refusal must see every PreArm line).

One module on purpose: it is the hot loop, one `update()` dispatch per
message over plain attributes; splitting the handlers across modules would add
a call per message.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mavjet.contract.events import EventType
from mavjet.contract.units import haversine_m
from mavjet.contract.vehicle import MAV_LANDED_STATE_IN_AIR, MAV_LANDED_STATE_ON_GROUND
from mavjet.drivers.mavlink.autopilot import (
    is_airborne,
    is_armed,
    is_autopilot_heartbeat,
    is_failsafe_state,
)
from mavjet.drivers.mavlink.dialect import MavMessage, mavlink2
from mavjet.drivers.mavlink.modes import ModeTable, flavour_of, table_for
from mavjet.drivers.mavlink.params import decode_param_id, decode_param_value, encoding_for
from mavjet.gateway.twin.statustext import (
    REACHED_PREFIX,
    ReachedPairing,
    RepeatCollapser,
    Summary,
    text_data,
)

_ON_GROUND = MAV_LANDED_STATE_ON_GROUND
_FAILSAFE_WORDS = (
    ("battery", "battery"), ("gcs", "gcs"), ("radio", "radio"), ("throttle", "radio"),
    ("ekf", "ekf"), ("fence", "geofence"), ("crash", "crash"),
)
# A STATUSTEXT naming a failsafe starts an episode even before HEARTBEAT says CRITICAL.
_STATUSTEXT_FAILSAFE_WINDOW_NS = 10_000_000_000
_RAD_TO_DEG = 180.0 / math.pi


@dataclass(frozen=True, slots=True)
class Event:
    type: str
    time_ns: int
    data: dict[str, Any]
    msg_id: str
    # Internal: for in-gateway subscribers only (the shadow, commands), never
    # published to TWIN_EVENTS nor counted as an event.
    internal: bool = False


@dataclass(slots=True)
class _Flight:
    armed_at_ns: int = 0
    takeoff_at_ns: int = 0
    battery_at_arm_pct: float | None = None
    max_alt_m: float = 0.0
    distance_m: float = 0.0
    last_lat: float | None = None
    last_lon: float | None = None


@dataclass(slots=True)
class TelemetryModel:
    """Everything the gateway knows about one vehicle, updated message by message."""

    vid: str
    # Channel payloads and the time of their newest sample.
    channels: dict[str, dict[str, Any]] = field(default_factory=dict)
    sample_ns: dict[str, int] = field(default_factory=dict)
    updated: set[str] = field(default_factory=set)
    # State samples made (one per channel update that carries a new sample time): against the
    # samples published, what decimation and overload replaced before its turn (gateway/twin/vehicle.py).
    samples: int = 0
    events: list[Event] = field(default_factory=list)
    # Identity.
    sysid: int = 0
    flavour: str = "unknown"
    vehicle_class: str = "unknown"
    modes: ModeTable | None = None
    # Flight state.
    armed: bool | None = None
    mode: str | None = None
    custom_mode: int | None = None
    system_status: int | None = None
    landed_state: int | None = None
    fix_type: int | None = None
    satellites: int | None = None
    battery_pct: float | None = None
    lat_deg: float | None = None
    lon_deg: float | None = None
    alt_m: float | None = None
    alt_msl_m: float | None = None
    home: tuple[float, float, float] | None = None
    fence_breached: bool = False
    mission_seq: int | None = None
    failsafe_active: bool = False
    _failsafe_hint: tuple[int, str] | None = None
    _last_boot_ms: int = 0
    _flight: _Flight = field(default_factory=_Flight)
    _seen_extended_state: bool = False
    _id_counts: dict[tuple[str, int], int] = field(default_factory=dict)
    texts: RepeatCollapser = field(default_factory=RepeatCollapser)
    _reached: ReachedPairing = field(default_factory=ReachedPairing)

    @property
    def last_boot_ms(self) -> int:
        """The autopilot's boot clock at the newest SYSTEM_TIME (0 before one); going backwards means a reboot."""
        return self._last_boot_ms

    # -- helpers -----------------------------------------------------------
    def _set(self, channel: str, t_ns: int, payload: dict[str, Any]) -> None:
        self.channels[channel] = payload
        self.sample_ns[channel] = t_ns
        self.updated.add(channel)
        self.samples += 1

    def snapshot(self) -> dict[str, Any]:
        snap: dict[str, Any] = {}
        if self.mode is not None:
            snap["mode"] = self.mode
        if self.armed is not None:
            snap["armed"] = self.armed
        if self.lat_deg is not None:
            snap["lat_deg"] = self.lat_deg
            snap["lon_deg"] = self.lon_deg
            snap["alt_m"] = self.alt_m
            snap["alt_msl_m"] = self.alt_msl_m
        if self.battery_pct is not None:
            snap["battery_pct"] = self.battery_pct
        if self.flavour != "unknown":
            snap["flavour"] = self.flavour
        return snap

    def emit(self, etype: str, t_ns: int, **extra: Any) -> Event:
        """Record an event with the vehicle snapshot; the msg id is stable for dedupe."""
        key = (etype, t_ns)
        n = self._id_counts.get(key, 0)
        self._id_counts[key] = n + 1
        if len(self._id_counts) > 4096:
            self._id_counts.clear()
        msg_id = f"{self.vid}:{etype}:{t_ns}" + (f":{n}" if n else "")
        data = self.snapshot()
        data.update(extra)
        ev = Event(etype, t_ns, data, msg_id)
        self.events.append(ev)
        return ev

    def drain_events(self) -> list[Event]:
        evs = self.events
        self.events = []
        return evs

    # -- the hot path ------------------------------------------------------
    def update(self, msg: MavMessage, recv_ns: int) -> None:
        handler = _BY_CLASS.get(type(msg), _first_of_class)
        if handler is not None:
            handler(self, msg, recv_ns)

    def update_many(self, msgs: list[MavMessage], recv_ns: int) -> None:
        """`update` for a batch received together: one call per batch, not per message."""
        by_class = _BY_CLASS
        for msg in msgs:
            handler = by_class.get(type(msg), _first_of_class)
            if handler is not None:
                handler(self, msg, recv_ns)

    def on_heartbeat(self, m: MavMessage, recv_ns: int) -> None:
        if not is_autopilot_heartbeat(m.type, m.autopilot):
            return
        if self.modes is None:
            self.modes = table_for(m.autopilot, m.type)
            self.flavour = flavour_of(m.autopilot).value
            self.vehicle_class = self.modes.vehicle_class.value
            self.sysid = m.get_srcSystem()
        armed = is_armed(m.base_mode)
        mode = self.modes.name(m.custom_mode)
        prev_mode, prev_armed = self.mode, self.armed
        self.custom_mode = m.custom_mode
        if prev_mode is not None and mode != prev_mode:
            self.mode = mode
            self.emit(EventType.MODE_CHANGED, recv_ns, previous_mode=prev_mode, custom_mode=m.custom_mode)
        self.mode = mode
        if prev_armed is not None and armed != prev_armed:
            self.armed = armed
            if armed:
                f = self._flight = _Flight(armed_at_ns=recv_ns, battery_at_arm_pct=self.battery_pct)
                f.last_lat, f.last_lon = self.lat_deg, self.lon_deg
                self.emit(EventType.ARMED, recv_ns)
            else:
                # ArduPilot disarms at touchdown, often before the next 1 Hz
                # EXTENDED_SYS_STATE says ON_GROUND: land first, then disarm.
                if is_airborne(self.landed_state) and (self.alt_m is None or self.alt_m < 2.0):
                    self._landed_transition(_ON_GROUND, recv_ns)
                f = self._flight
                used = None
                if f.battery_at_arm_pct is not None and self.battery_pct is not None:
                    used = round(f.battery_at_arm_pct - self.battery_pct, 2)
                self.emit(
                    EventType.DISARMED, recv_ns, max_alt_m=round(f.max_alt_m, 2), distance_m=round(f.distance_m, 1),
                    battery_used_pct=used, flight_s=round((recv_ns - f.armed_at_ns) / 1e9, 1) if f.armed_at_ns else None,
                )
        self.armed = armed
        prev_status = self.system_status
        self.system_status = m.system_status
        critical = is_failsafe_state(m.system_status)
        if critical and not self.failsafe_active:
            self._start_failsafe(recv_ns)
        elif not critical and is_failsafe_state(prev_status) and self.failsafe_active:
            self.failsafe_active = False
        self._set_status(recv_ns)

    def _start_failsafe(self, t_ns: int) -> None:
        self.failsafe_active = True
        kind = "unknown"
        if self._failsafe_hint is not None and t_ns - self._failsafe_hint[0] < _STATUSTEXT_FAILSAFE_WINDOW_NS:
            kind = self._failsafe_hint[1]
        self.emit(EventType.FAILSAFE, t_ns, failsafe_type=kind, action_taken=self.mode, system_status=self.system_status)

    def _set_status(self, t_ns: int) -> None:
        self._set(
            "status", t_ns,
            {
                "mode": self.mode, "armed": self.armed, "custom_mode": self.custom_mode,
                "system_status": self.system_status, "landed_state": self.landed_state,
                "failsafe": self.failsafe_active, "flavour": self.flavour,
                "vehicle_class": self.vehicle_class, "mission_seq": self.mission_seq,
                "fence_breached": self.fence_breached,
                "home": None if self.home is None else {
                    "lat_deg": self.home[0], "lon_deg": self.home[1], "alt_msl_m": self.home[2],
                },
            },
        )

    def on_global_position(self, m: MavMessage, recv_ns: int) -> None:
        lat, lon = m.lat * 1e-7, m.lon * 1e-7
        alt_rel = m.relative_alt * 1e-3
        self.lat_deg, self.lon_deg, self.alt_m, self.alt_msl_m = lat, lon, alt_rel, m.alt * 1e-3
        vn, ve, vd = m.vx * 0.01, m.vy * 0.01, m.vz * 0.01
        # `_set` written out: this and ATTITUDE are two thirds of all messages.
        self.channels["position"] = {
            "lat_deg": lat, "lon_deg": lon, "alt_m": alt_rel, "alt_msl_m": self.alt_msl_m,
            "vn_m_s": vn, "ve_m_s": ve, "vd_m_s": vd,
            "groundspeed_m_s": math.hypot(vn, ve),
            "heading_deg": None if m.hdg == 65535 else m.hdg * 0.01,
            "time_boot_ms": m.time_boot_ms,
        }
        self.sample_ns["position"] = recv_ns
        self.updated.add("position")
        self.samples += 1
        if self.armed:
            f = self._flight
            f.max_alt_m = max(f.max_alt_m, alt_rel)
            if f.last_lat is not None and f.last_lon is not None:
                f.distance_m += haversine_m(f.last_lat, f.last_lon, lat, lon)
            f.last_lat, f.last_lon = lat, lon
            if not self._seen_extended_state:
                # No EXTENDED_SYS_STATE: infer airborne from height above home.
                if self.landed_state != MAV_LANDED_STATE_IN_AIR and alt_rel > 1.0:
                    self._landed_transition(MAV_LANDED_STATE_IN_AIR, recv_ns)
                elif self.landed_state == MAV_LANDED_STATE_IN_AIR and alt_rel < 0.3 and abs(vd) < 0.2:
                    self._landed_transition(_ON_GROUND, recv_ns)

    def on_attitude(self, m: MavMessage, recv_ns: int) -> None:
        d = _RAD_TO_DEG  # math.degrees is this very multiplication, without a call per field
        self.channels["attitude"] = {
            "roll_deg": m.roll * d, "pitch_deg": m.pitch * d, "yaw_deg": m.yaw * d,
            "roll_rate_deg_s": m.rollspeed * d, "pitch_rate_deg_s": m.pitchspeed * d,
            "yaw_rate_deg_s": m.yawspeed * d, "time_boot_ms": m.time_boot_ms,
        }
        self.sample_ns["attitude"] = recv_ns
        self.updated.add("attitude")
        self.samples += 1

    def on_vfr_hud(self, m: MavMessage, recv_ns: int) -> None:
        pos = self.channels.get("position")
        if pos is not None:
            pos["airspeed_m_s"] = m.airspeed
            pos["climb_m_s"] = m.climb
            pos["throttle_pct"] = m.throttle

    def on_sys_status(self, m: MavMessage, recv_ns: int) -> None:
        if m.battery_remaining >= 0:
            self.battery_pct = float(m.battery_remaining)
        bat = self.channels.get("battery") or {}
        bat.update(
            {
                "voltage_v": None if m.voltage_battery == 65535 else m.voltage_battery / 1000.0,
                "current_a": None if m.current_battery < 0 else m.current_battery / 100.0,
                "remaining_pct": self.battery_pct,
                "comm_drop_pct": m.drop_rate_comm / 100.0,
            }
        )
        self._set("battery", recv_ns, bat)

    def on_battery_status(self, m: MavMessage, recv_ns: int) -> None:
        bat = self.channels.get("battery") or {}
        cells = [v for v in m.voltages if v not in (65535, 0)]
        bat.update(
            {
                "consumed_mah": None if m.current_consumed < 0 else m.current_consumed,
                "cell_voltages_v": [c / 1000.0 for c in cells],
                "temperature_c": None if m.temperature == 32767 else m.temperature / 100.0,
            }
        )
        if m.battery_remaining >= 0:
            self.battery_pct = float(m.battery_remaining)
            bat["remaining_pct"] = self.battery_pct
        if "voltage_v" in bat:
            # SYS_STATUS drives the channel's rate; BATTERY_STATUS only enriches
            # it. Two 1 Hz sources out of phase would otherwise make every
            # published sample half a second old.
            self.channels["battery"] = bat
        else:
            self._set("battery", recv_ns, bat)

    def on_gps_raw(self, m: MavMessage, recv_ns: int) -> None:
        prev = self.fix_type
        self.fix_type, self.satellites = m.fix_type, m.satellites_visible
        if prev is not None and prev != m.fix_type:
            self.emit(EventType.GPS_FIX_CHANGED, recv_ns, fix_type=m.fix_type, previous_fix_type=prev,
                      satellites=m.satellites_visible)
        self._set(
            "gps", recv_ns,
            {
                "fix_type": m.fix_type, "satellites": m.satellites_visible,
                "hdop": None if m.eph == 65535 else m.eph / 100.0,
                "vdop": None if m.epv == 65535 else m.epv / 100.0,
                "lat_deg": m.lat * 1e-7, "lon_deg": m.lon * 1e-7, "alt_msl_m": m.alt * 1e-3,
            },
        )

    def on_extended_sys_state(self, m: MavMessage, recv_ns: int) -> None:
        self._seen_extended_state = True
        self._landed_transition(m.landed_state, recv_ns)

    def _landed_transition(self, new: int, t_ns: int) -> None:
        prev = self.landed_state
        self.landed_state = new
        if prev == new or prev is None:
            return
        if prev == _ON_GROUND and is_airborne(new):
            self._flight.takeoff_at_ns = t_ns
            self.emit(EventType.TAKEOFF, t_ns)
        elif is_airborne(prev) and new == _ON_GROUND:
            f = self._flight
            self.emit(
                EventType.LANDED, t_ns, max_alt_m=round(f.max_alt_m, 2), distance_m=round(f.distance_m, 1),
                flight_s=round((t_ns - f.takeoff_at_ns) / 1e9, 1) if f.takeoff_at_ns else None,
            )

    def on_home_position(self, m: MavMessage, recv_ns: int) -> None:
        home = (m.latitude * 1e-7, m.longitude * 1e-7, m.altitude * 1e-3)
        prev = self.home
        if prev is None or haversine_m(prev[0], prev[1], home[0], home[1]) > 1.0 or abs(prev[2] - home[2]) > 1.0:
            self.home = home
            self.emit(EventType.HOME_SET, recv_ns, home_lat_deg=home[0], home_lon_deg=home[1], home_alt_msl_m=home[2])

    def on_system_time(self, m: MavMessage, recv_ns: int) -> None:
        # Only the boot clock is kept (a reboot shows as it going backwards);
        # the vehicle's UTC never becomes a sample time (see the module docstring).
        self._last_boot_ms = m.time_boot_ms

    def on_statustext(self, m: MavMessage, recv_ns: int) -> None:
        text = m.text if isinstance(m.text, str) else bytes(m.text).decode("utf-8", "replace")
        text = text.rstrip("\x00")
        low = text.lower()
        if "failsafe" in low:
            kind = next((k for w, k in _FAILSAFE_WORDS if w in low), "unknown")
            self._failsafe_hint = (recv_ns, kind)
            if not self.failsafe_active and m.severity <= mavlink2.MAV_SEVERITY_CRITICAL:
                self._start_failsafe(recv_ns)
        severity = m.severity
        if text.startswith(REACHED_PREFIX):
            seq = self._reached.text(text, recv_ns)
            if seq is not None:
                self.emit(EventType.MISSION_ITEM_REACHED, recv_ns, seq=seq)
            return
        ended: list[Summary] = []
        repeat = self.texts.offer(severity, text, recv_ns, ended)
        self._summaries(ended)
        if repeat:
            self.events.append(Event(EventType.STATUSTEXT, recv_ns, text_data(severity, text, 1), "", internal=True))
        else:
            self.emit(EventType.STATUSTEXT, recv_ns, **text_data(severity, text, 1))

    def _summaries(self, ended: list[Summary]) -> None:
        for s in ended:
            self.emit(EventType.STATUSTEXT, s.time_ns, **text_data(s.severity, s.text, s.count),
                      window_s=round(self.texts.window_ns / 1e9, 3))

    @property
    def repeats_pending(self) -> bool:
        """True while some status text is inside its collapse window (`flush_repeats` has work)."""
        return self.texts.pending

    def flush_repeats(self, now_ns: int, *, flush: bool = False) -> None:
        """Summaries of the collapse windows over at `now_ns` (all of them with `flush`, at shutdown)."""
        self._summaries(self.texts.due(now_ns, flush=flush))

    def on_mission_item_reached(self, m: MavMessage, recv_ns: int) -> None:
        if self._reached.message(m.seq, recv_ns):
            self.emit(EventType.MISSION_ITEM_REACHED, recv_ns, seq=m.seq)

    def on_param_value(self, m: MavMessage, recv_ns: int) -> None:
        # Internal only: the shadow hears of a param changed on the vehicle (a
        # ground station, RC) at once instead of at its periodic verify.
        value = decode_param_value(float(m.param_value), m.param_type, encoding_for(self.flavour))
        data = {"name": decode_param_id(m.param_id), "value": value, "param_type": m.param_type}
        self.events.append(Event(EventType.PARAM_VALUE, recv_ns, data, "", internal=True))

    def on_mission_current(self, m: MavMessage, recv_ns: int) -> None:
        self.mission_seq = m.seq

    def on_fence_status(self, m: MavMessage, recv_ns: int) -> None:
        breached = bool(m.breach_status)
        if breached and not self.fence_breached:
            self.emit(EventType.GEOFENCE_BREACH, recv_ns, breach_type=m.breach_type, breach_count=m.breach_count)
        self.fence_breached = breached


Handler = Callable[[TelemetryModel, MavMessage, int], None]

# The handler of each MAVLink message name.
_HANDLERS: dict[str, Handler] = {
    "HEARTBEAT": TelemetryModel.on_heartbeat,
    "GLOBAL_POSITION_INT": TelemetryModel.on_global_position,
    "ATTITUDE": TelemetryModel.on_attitude,
    "VFR_HUD": TelemetryModel.on_vfr_hud,
    "SYS_STATUS": TelemetryModel.on_sys_status,
    "BATTERY_STATUS": TelemetryModel.on_battery_status,
    "GPS_RAW_INT": TelemetryModel.on_gps_raw,
    "EXTENDED_SYS_STATE": TelemetryModel.on_extended_sys_state,
    "HOME_POSITION": TelemetryModel.on_home_position,
    "SYSTEM_TIME": TelemetryModel.on_system_time,
    "STATUSTEXT": TelemetryModel.on_statustext,
    "MISSION_ITEM_REACHED": TelemetryModel.on_mission_item_reached,
    "MISSION_CURRENT": TelemetryModel.on_mission_current,
    "PARAM_VALUE": TelemetryModel.on_param_value,
    "FENCE_STATUS": TelemetryModel.on_fence_status,
}

# The handler of each message class (None: not handled), learned from the first message of the class:
# pymavlink's classes and the framer's light ones (drivers/mavlink/light.py) are one class per message
# name, so a message is dispatched on `type(msg)`, hashed by identity, with no attribute read; a class
# not seen yet gets `_first_of_class`, which learns it and handles the message.
_BY_CLASS: dict[type, Handler | None] = {}


def _first_of_class(model: TelemetryModel, msg: MavMessage, recv_ns: int) -> None:
    handler = _HANDLERS.get(msg.get_type())
    _BY_CLASS[type(msg)] = handler
    if handler is not None:
        handler(model, msg, recv_ns)
