"""Synthetic audit trail (`mavjet synth`): publish a realistic synthetic event history to TWIN_EVENTS.

Replaying 90 days of a fleet needs 90 days of a fleet; this generates one:
per vehicle and day a few flights (armed, takeoff, mode changes, mission
items, landed, disarmed), failsafes with the mode they forced and the
landing that followed, statustext, operator commands with their cmd_result
(result mix and latencies), link outages. Payloads follow docs/events.md
exactly, so the analytics jobs cannot tell it from gateway output.

Generation is pure and deterministic: every (seed, vehicle, day) has its own
random stream, so the history does not depend on publish order or on how many
vehicles are generated. `Truth` records what was generated (counts, and if
asked the flights, failsafes and commands) so tests can check job output
against the known history. Publishing uses `publish_async` batching with
`Nats-Msg-Id`, so publishing the same history twice within the stream's
duplicate window stores it once. With `track_hz` > 0 each flight's track goes
to TWIN_TRACKS too, sampled like the gateway's recorder samples a real one
(analytics/synthtrack.py).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from mavjet.analytics.synthtrack import HOME_ALT_MSL_M, FlightPath, Key, period_ns
from mavjet.analytics.truth import ChainTruth, CommandTruth, FailsafeTruth, FlightTruth, Truth
from mavjet.contract.commands import CommandName
from mavjet.contract.envelope import CONTENT_TYPE, pack
from mavjet.contract.errors import ConfigError
from mavjet.contract.events import EFFECTS, EventType
from mavjet.contract.modes import Flavour, ModeTable, VehicleClass
from mavjet.contract.subjects import event_subject, track_subject
from mavjet.contract.tracks import encode_sample, track_msg_id
from mavjet.contract.units import haversine_m
from mavjet.contract.vehicle import MAV_STATE_CRITICAL

DAY_NS = 86_400 * 10**9
MS = 10**6

FAILSAFE_TYPES = ("battery", "gcs", "radio", "ekf", "geofence")
# The mode a copter of each flavour is in for each part of a flight, named as the gateway names it
# (contract/modes.py, whose table also gives each its custom_mode).
MODES = {
    Flavour.ARDUPILOT: {"ground": "STABILIZE", "takeoff": "GUIDED", "mission": "AUTO", "loiter": "LOITER",
                        "rtl": "RTL", "land": "LAND"},
    Flavour.PX4: {"ground": "POSCTL", "takeoff": "AUTO.TAKEOFF", "mission": "AUTO.MISSION", "loiter": "AUTO.LOITER",
                  "rtl": "AUTO.RTL", "land": "AUTO.LAND"},
}
SEVERITY_NAMES = ("EMERGENCY", "ALERT", "CRITICAL", "ERROR", "WARNING", "NOTICE", "INFO", "DEBUG")
# Results of the occasional extra commands (goto, param_set...), by weight.
EXTRA_RESULTS = (("accepted", 80), ("rejected", 6), ("failed", 4), ("timeout", 4), ("expired", 3), ("invalid", 3))
# Results after which a command may still have acted on the vehicle; the
# others (refused, never sent) cannot have caused anything.
EFFECT_RESULTS = ("accepted", "timeout", "unknown")
MAV_RESULT = {"accepted": 0, "rejected": 2, "failed": 4, "timeout": None, "expired": None, "invalid": None}


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditConfig:
    vehicles: int
    days: int
    seed: int = 1
    env: str = "prod"
    end_ns: int  # history ends here (exclusive); days run back from it
    flights_per_day: float = 1.0
    failsafe_prob: float = 0.15
    link_loss_prob: float = 0.05
    extra_commands_per_flight: float = 0.5
    base_lat_deg: float = 47.397742
    base_lon_deg: float = 8.545594

    def __post_init__(self) -> None:
        if self.vehicles < 1 or self.vehicles > 1_000_000:
            raise ConfigError("vehicles", "must be 1..1000000")
        if self.days < 1 or self.days > 3650:
            raise ConfigError("days", "must be 1..3650")
        if not 0 <= self.failsafe_prob <= 1 or not 0 <= self.link_loss_prob <= 1:
            raise ConfigError("failsafe_prob", "probabilities must be within 0..1")
        if not 0 < self.flights_per_day <= 24:
            raise ConfigError("flights_per_day", "must be > 0 and <= 24")

    @property
    def start_ns(self) -> int:
        return self.end_ns - self.days * DAY_NS


@dataclass(frozen=True, slots=True)
class SynthEvent:
    time_ns: int
    vid: str
    type: str
    data: dict[str, Any]
    msg_id: str


def vid_name(i: int) -> str:
    return f"VID-{i:04d}"


class _Vehicle:
    """Mutable per-vehicle state while one day is generated (position, battery, mode)."""

    def __init__(self, cfg: AuditConfig, index: int, day: int, truth: Truth) -> None:
        self.cfg = cfg
        self.truth = truth
        self.vid = vid_name(index)
        self.rng = random.Random(f"mavjet-audit:{cfg.seed}:{index}:{day}")
        # A second stream for the set_mode/land commands, so that adding them
        # left the rest of every history as it was.
        self.rng2 = random.Random(f"mavjet-audit-cmd:{cfg.seed}:{index}:{day}")
        self.pending: dict[str, ChainTruth] = {}
        self.flight_cmds: list[tuple[str, str]] = []
        home_rng = random.Random(f"mavjet-audit-home:{cfg.seed}:{index}")
        self.flavour = Flavour.ARDUPILOT if home_rng.random() < 0.7 else Flavour.PX4
        self.home = (
            cfg.base_lat_deg + home_rng.uniform(-0.5, 0.5),
            cfg.base_lon_deg + home_rng.uniform(-0.5, 0.5),
        )
        self.modes = MODES[self.flavour]
        self.table = ModeTable(flavour=self.flavour, vehicle_class=VehicleClass.COPTER)
        self.mode = self.modes["ground"]
        self.armed = False
        self.lat, self.lon = self.home
        self.alt_m = 0.0
        self.battery_pct = 100.0
        self.t_ns = cfg.start_ns + day * DAY_NS
        self.events: list[SynthEvent] = []
        self.cmd_n = 0
        self.day = day
        self.paths: list[FlightPath] = []  # this day's flights, for the track samples
        self._keys: list[Key] | None = None  # the flight in progress: its state at each event

    # -- building blocks -------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "armed": self.armed,
            "lat_deg": round(self.lat, 7),
            "lon_deg": round(self.lon, 7),
            "alt_m": round(self.alt_m, 2),
            "alt_msl_m": round(self.alt_m + HOME_ALT_MSL_M, 2),
            "battery_pct": round(self.battery_pct, 1),
            "flavour": self.flavour.value,
        }

    def advance(self, lo_s: float, hi_s: float) -> None:
        self.t_ns += int(self.rng.uniform(lo_s, hi_s) * 1e9) + MS  # strictly increasing

    def emit(self, event: EventType, extra: dict[str, Any] | None = None, disc: str = "") -> None:
        etype = event.value  # a plain str in what is published and counted
        data = self.snapshot()
        if extra:
            data.update(extra)
        msg_id = f"{self.vid}:{etype}:{self.t_ns}" + (f":{disc}" if disc else "")
        self.events.append(SynthEvent(self.t_ns, self.vid, etype, data, msg_id))
        if self._keys is not None:  # recorded only: no random draw, so the history stays as it was
            self._keys.append(Key(self.t_ns, self.lat, self.lon, self.alt_m, self.battery_pct, etype))
        self.truth.events += 1
        self.truth.by_type[etype] += 1
        chain = self.pending.pop(etype, None)
        if chain is not None:
            chain.effect_ns = self.t_ns

    def command(self, command: CommandName, result: str = "accepted") -> None:
        """A cmd_result; the event an accepted command causes next is the catalogue's (contract/events.py)."""
        name = command.value
        caused = EFFECTS.get(command)
        effect = None if caused is None else caused[0].value
        self.cmd_n += 1
        cmd_id = f"{self.vid}-{self.day}-{self.cmd_n}"
        if result == "timeout":
            latency_ms = round(self.rng.uniform(3000, 6000), 1)
        elif result in ("expired", "invalid"):
            latency_ms = round(self.rng.uniform(0.2, 3.0), 2)
        else:
            latency_ms = round(self.rng.lognormvariate(math.log(45.0), 0.6), 2)
        self.t_ns += MS
        issued_ns = self.t_ns
        self.t_ns += int(latency_ms * MS)
        self.emit(
            EventType.CMD_RESULT,
            {
                "cmd_id": cmd_id,
                "name": name,
                "result": result,
                "mav_result": MAV_RESULT[result],
                "detail": "" if result == "accepted" else f"{name} {result}",
                "attempts": 1 if result != "timeout" else 3,
                "latency_ms": latency_ms,
            },
            disc=cmd_id,
        )
        self.truth.commands_by_result[result] += 1
        self.flight_cmds.append((name, result))
        chain = ChainTruth(
            vid=self.vid, cmd_id=cmd_id, name=name, result=result, issued_ns=issued_ns,
            effect_type=effect if result in EFFECT_RESULTS else None,
        )
        if chain.effect_type is not None:
            self.pending[chain.effect_type] = chain
        if self.truth.keep_detail:
            self.truth.commands.append(
                CommandTruth(vid=self.vid, name=name, result=result, latency_ms=latency_ms, cmd_id=cmd_id,
                             issued_ns=issued_ns)
            )
            self.truth.chains.append(chain)

    def set_mode(self, mode: str, flight_modes: list[str]) -> None:
        prev, self.mode = self.mode, mode
        self.emit(EventType.MODE_CHANGED, {"previous_mode": prev, "custom_mode": self.table.custom_mode(mode)})
        flight_modes.append(mode)

    def statustext(self, severity: int, text: str) -> None:
        self.emit(EventType.STATUSTEXT, {"severity": severity, "severity_name": SEVERITY_NAMES[severity], "text": text})

    # -- one flight --------------------------------------------------------
    def fly(self) -> None:
        rng = self.rng
        flight_modes: list[str] = [self.mode]
        failsafes: list[str] = []
        self.flight_cmds = []
        self.battery_pct = round(rng.uniform(92.0, 100.0), 1)
        if rng.random() < 0.05:
            self.command(CommandName.ARM, "rejected")
            self.statustext(3, "PreArm: Battery below minimum arming voltage")
            self.advance(5, 30)
        self.command(CommandName.ARM)
        self.armed = True
        start_ns = self.t_ns
        start_batt = self.battery_pct
        self._keys = []
        self.emit(EventType.ARMED)
        self.advance(1, 3)
        self.set_mode(self.modes["takeoff"], flight_modes)
        self.advance(0.5, 2)
        self.command(CommandName.TAKEOFF)
        takeoff_ns = self.t_ns
        target_alt = round(rng.uniform(20.0, 120.0), 1)
        self.alt_m = 1.5
        self.emit(EventType.TAKEOFF)
        max_alt = 1.5
        distance = 0.0
        self.advance(5, 15)
        self.alt_m = target_alt
        max_alt = max(max_alt, self.alt_m)
        if self.rng2.random() < 0.3:  # the operator holds position first (sometimes refused)
            ok = self.rng2.random() < 0.85
            self.command(CommandName.SET_MODE, "accepted" if ok else "rejected")
            if ok:
                self.t_ns += int(self.rng2.uniform(0.2, 1.5) * 1e9)
                self.set_mode(self.modes["loiter"], flight_modes)
            self.t_ns += int(self.rng2.uniform(2.0, 10.0) * 1e9)
        self.command(CommandName.MISSION_START)
        self.set_mode(self.modes["mission"], flight_modes)
        n_items = rng.randint(2, 6)
        fs_at = rng.randint(1, n_items) if rng.random() < self.cfg.failsafe_prob else 0
        link_at = rng.randint(1, n_items) if rng.random() < self.cfg.link_loss_prob else 0
        failsafe_ns = 0
        for item in range(1, n_items + 1):
            self.advance(20, 120)
            lat = self.lat + rng.uniform(-0.004, 0.004)
            lon = self.lon + rng.uniform(-0.004, 0.004)
            distance += haversine_m(self.lat, self.lon, lat, lon)
            self.lat, self.lon = lat, lon
            self.alt_m = round(target_alt + rng.uniform(-5.0, 15.0), 1)
            max_alt = max(max_alt, self.alt_m)
            self.battery_pct = max(5.0, round(self.battery_pct - rng.uniform(2.0, 8.0), 1))
            self.emit(EventType.MISSION_ITEM_REACHED, {"seq": item})
            if rng.random() < self.cfg.extra_commands_per_flight / n_items:
                self.advance(0.5, 3)
                names = (CommandName.GOTO, CommandName.PARAM_SET, CommandName.SET_MODE, CommandName.RTL)
                self.command(rng.choice(names[:2]), _weighted(rng, EXTRA_RESULTS))
            if item == link_at:
                self.advance(1, 3)
                self.emit(EventType.LINK_LOST, {"heartbeat_age_s": round(rng.uniform(3.0, 6.0), 1)})
                outage = round(rng.uniform(5.0, 90.0), 1)
                self.t_ns += int(outage * 1e9)
                self.emit(EventType.LINK_RESTORED, {"outage_s": outage})
            if item == fs_at:
                self.advance(1, 10)
                fs_type = rng.choice(FAILSAFE_TYPES)
                action = self.modes["land"] if fs_type in ("battery", "ekf") else self.modes["rtl"]
                if fs_type == "battery":
                    self.battery_pct = round(rng.uniform(10.0, 20.0), 1)
                failsafe_ns = self.t_ns
                self.emit(EventType.FAILSAFE, {"failsafe_type": fs_type, "action_taken": action,
                                                 "system_status": MAV_STATE_CRITICAL})
                self.statustext(2, f"Failsafe: {fs_type}, {action}")
                self.advance(0.1, 1)
                self.set_mode(action, flight_modes)
                failsafes.append(fs_type)
                self.truth.failsafes_by_type[fs_type] += 1
                break
        if not failsafe_ns:
            self.advance(1, 5)
            back = CommandName.RTL if self.rng2.random() < 0.8 else CommandName.LAND
            self.command(back)
            self.set_mode(self.modes[back.value], flight_modes)
        # the way home (or down)
        self.advance(30, 180)
        if self.mode == self.modes["rtl"]:
            distance += haversine_m(self.lat, self.lon, *self.home)
            self.lat, self.lon = self.home
        self.battery_pct = max(3.0, round(self.battery_pct - rng.uniform(2.0, 6.0), 1))
        self.alt_m = 0.0
        self.emit(
            EventType.LANDED,
            {"max_alt_m": round(max_alt, 2), "distance_m": round(distance, 1),
             "flight_s": round((self.t_ns - takeoff_ns) / 1e9, 1)},
        )
        landed_ns = self.t_ns
        self.advance(2, 10)
        self.armed = False
        used = round(start_batt - self.battery_pct, 1)
        self.emit(
            EventType.DISARMED,
            {"max_alt_m": round(max_alt, 2), "distance_m": round(distance, 1), "battery_used_pct": used,
             "flight_s": round((self.t_ns - start_ns) / 1e9, 1)},
        )
        end_ns = self.t_ns
        if self._keys is not None:
            self.paths.append(FlightPath(self.vid, tuple(self._keys)))
            self._keys = None
        self.mode = self.modes["ground"]
        self.truth.flights_by_vid[self.vid] += 1
        if self.truth.keep_detail:
            dedup: list[str] = []
            for m in flight_modes:
                if m not in dedup:
                    dedup.append(m)
            self.truth.flights.append(
                FlightTruth(vid=self.vid, start_ns=start_ns, end_ns=end_ns, max_alt_m=round(max_alt, 2),
                            distance_m=round(distance, 1), battery_used_pct=used, modes=dedup,
                            failsafes=failsafes, takeoff_ns=takeoff_ns, landed_ns=landed_ns,
                            commands=list(self.flight_cmds))
            )
            if failsafe_ns:
                self.truth.failsafes.append(
                    FailsafeTruth(vid=self.vid, time_ns=failsafe_ns, failsafe_type=failsafes[0], landed_ns=landed_ns)
                )

    def day_events(self) -> list[SynthEvent]:
        rng = self.rng
        fpd = self.cfg.flights_per_day
        n = int(fpd) + (1 if rng.random() < fpd - int(fpd) else 0)
        day_start = self.t_ns
        slot_ns = DAY_NS // max(n, 1)
        # 06:00 .. the gateway comes up with the vehicle
        for k in range(n):
            self.t_ns = max(self.t_ns, day_start + k * slot_ns + int(rng.uniform(0.05, 0.3) * slot_ns))
            if k == 0:
                self.emit(EventType.GATEWAY_STARTED, {"gateway": f"gw-{self.vid}", "version": "0.1.0"})
                self.advance(5, 60)
            self.fly()
        return self.events


def _weighted(rng: random.Random, table: tuple[tuple[str, int], ...]) -> str:
    total = sum(w for _, w in table)
    x = rng.uniform(0, total)
    for name, w in table:
        x -= w
        if x <= 0:
            return name
    return table[-1][0]


def generate_days(cfg: AuditConfig, truth: Truth) -> Iterator[tuple[list[SynthEvent], list[FlightPath]]]:
    """Yield one day at a time: its events, time-ordered across vehicles, and its flights' paths."""
    for day in range(cfg.days):
        events: list[SynthEvent] = []
        paths: list[FlightPath] = []
        for i in range(1, cfg.vehicles + 1):
            v = _Vehicle(cfg, i, day, truth)
            events.extend(v.day_events())
            paths.extend(v.paths)
        events.sort(key=lambda e: (e.time_ns, e.vid))
        yield events, paths


def generate(cfg: AuditConfig, truth: Truth) -> Iterator[list[SynthEvent]]:
    """Yield one day of the fleet's history at a time, time-ordered across vehicles."""
    for events, _ in generate_days(cfg, truth):
        yield events


@dataclass(frozen=True, slots=True, kw_only=True)
class Published:
    events: int
    track_samples: int


async def publish_history(
    js: Any, cfg: AuditConfig, truth: Truth, *, max_events: int | None = None, track_hz: float = 0.0
) -> Published:
    """Publish the events and, with `track_hz` > 0, each flight's track samples to TWIN_TRACKS.

    Tracks are not events: they leave `truth` and the `max_events` count
    alone. When `max_events` cuts the history short, samples stop at the last
    published event's time, so no track runs ahead of the events it belongs to.
    """
    every_ns = period_ns(track_hz) if track_hz > 0 else 0
    n = samples = 0
    for day, paths in generate_days(cfg, truth):
        cut_ns: int | None = None
        for ev in day:
            if max_events is not None and n >= max_events:
                break
            headers = {"Content-Type": CONTENT_TYPE, "Nats-Msg-Id": ev.msg_id}
            await js.publish_async(
                event_subject(cfg.env, ev.vid, ev.type), pack(ev.vid, ev.time_ns, ev.data), headers=headers
            )
            n += 1
            cut_ns = ev.time_ns
        stopped = max_events is not None and n >= max_events
        for path in paths if every_ns else ():
            for t, data in path.samples(every_ns):
                if stopped and (cut_ns is None or t > cut_ns):
                    break
                headers = {"Content-Type": CONTENT_TYPE, "Nats-Msg-Id": track_msg_id(path.vid, t)}
                await js.publish_async(track_subject(cfg.env, path.vid), encode_sample(path.vid, t, data),
                                       headers=headers)
                samples += 1
        if stopped:
            break
    await asyncio.wait_for(js.publish_async_completed(), timeout=120)
    return Published(events=n, track_samples=samples)


async def publish(js: Any, cfg: AuditConfig, truth: Truth, *, max_events: int | None = None,
                  track_hz: float = 0.0) -> int:
    """Publish the history (and tracks with `track_hz` > 0); returns the number of events published."""
    return (await publish_history(js, cfg, truth, max_events=max_events, track_hz=track_hz)).events


def default_end_ns() -> int:
    now = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0)
    return int(now.timestamp()) * 10**9


__all__ = [
    "AuditConfig", "ChainTruth", "CommandTruth", "FailsafeTruth", "FlightPath", "FlightTruth", "Published",
    "SynthEvent", "Truth", "default_end_ns", "generate", "generate_days", "publish",
    "publish_history", "vid_name",
]
