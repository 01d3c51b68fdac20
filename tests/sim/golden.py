"""Scripted scenarios whose MAVLink bytes pin the simulator's behaviour (tests/sim/test_golden.py).

Each scenario drives one `VehicleModel` through scripted sim time, with no
sockets and no wall clock: messages from a ground station are packed and
parsed by pymavlink (as the vehicle's link does), handed to the model at the
scripted instant, and everything the model says is framed the way the
vehicle's link frames it (`mavjet.sim.encoder`, one sequence number per
frame). The frames of a scenario, concatenated, are its bytes; the fixture
`golden.json` keeps their sha256, length and frame count.

A refactoring of sim/ that keeps these bytes keeps the behaviour a gateway
sees. A change that is meant to alter what the simulator says rewrites the
fixture, on purpose: `python -m tests.sim.golden --write`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from pymavlink.dialects.v20 import ardupilotmega as mavlink2

from mavjet.sim.encoder import Encoder
from mavjet.sim.missions import FENCE, MISSION, RALLY
from mavjet.sim.model import VehicleModel, VehicleOptions
from mavjet.sim.modes import FLAVOURS, px4_custom
from mavjet.sim.sortie import Sortie

R = mavlink2
FIXTURE: Final = Path(__file__).with_name("golden.json")
TICK_S: Final = 0.05  # sim seconds between steps, the fleet's default tick at speedup 1
GCS: Final = (255, 190)
REBOOT_S: Final = 1.0  # sim seconds off the air after a reboot, the fleet's default
# A fixed UTC for sim time 0 (the fleet takes the real time; SYSTEM_TIME and HOME_POSITION carry it).
EPOCH_UNIX_S: Final = 1_767_225_600.0
HOME: Final = (-35.363261, 149.165230, 584.0)


class Rig:
    """One vehicle model on a scripted clock, its output framed as the vehicle's link frames it."""

    def __init__(self, flavour: str, **opts: Any) -> None:
        base: dict[str, Any] = dict(
            sysid=1, flavour=FLAVOURS[flavour], lat_deg=HOME[0], lon_deg=HOME[1], ground_amsl_m=HOME[2],
            heading_deg=353.0, epoch_unix_s=EPOCH_UNIX_S, seed=11, heartbeat_phase_s=0.3,
        )
        base.update(opts)
        self.v = VehicleModel(VehicleOptions(**base))
        self.encoder = Encoder()
        self.gcs = mavlink2.MAVLink(None, *GCS)
        self.parser = mavlink2.MAVLink(None, 255, 0)
        self.parser.robust_parsing = True
        self.frames: list[bytes] = []
        self.seq = 0
        self.k = 0  # steps taken: sim time is k * TICK_S, never a running sum
        self.wall = 1000.0  # the retransmission window's clock: advanced with sim time, never read from the OS
        self.rebooting_until: float | None = None

    @property
    def now(self) -> float:
        return self.k * TICK_S

    def send(self, msg: Any) -> None:
        """A ground station's message, through pymavlink's packing and parsing, handled now."""
        data = msg.pack(self.gcs)
        self.gcs.seq = (self.gcs.seq + 1) & 0xFF
        if self.rebooting_until is not None:
            return  # nobody is listening
        for m in self.parser.parse_buffer(data) or []:
            self.v.handle(m, (m.get_srcSystem(), m.get_srcComponent()), self.now, self.wall)
        self.flush()

    def long(self, cmd: int, *p: float, confirmation: int = 0) -> None:
        params = [*p, *[0.0] * (7 - len(p))]
        self.send(R.MAVLink_command_long_message(self.v.sysid, 1, cmd, confirmation, *params))

    def int_cmd(self, cmd: int, frame: int, *p: float, x: int = 0, y: int = 0, z: float = 0.0) -> None:
        params = [*p, *[0.0] * (4 - len(p))]
        self.send(R.MAVLink_command_int_message(self.v.sysid, 1, frame, cmd, 0, 0, *params, x, y, z))

    def run(self, seconds: float) -> None:
        """Step the model tick by tick, as the fleet's loop does, with a reboot's downtime."""
        for _ in range(round(seconds / TICK_S)):
            self.k += 1
            self.wall += TICK_S
            if self.rebooting_until is not None:
                if self.now < self.rebooting_until:
                    continue
                self.rebooting_until = None
                self.v.reboot_now(self.now)
            self.v.step(self.now)
            self.flush()

    def flush(self) -> None:
        v = self.v
        out, v.out = v.out, []
        for item in out:
            if type(item) is tuple:
                frame = item[0].frame(v.sysid, v.compid, self.seq, item[1])
            else:
                frame = self.encoder.frame(v.sysid, v.compid, self.seq, item)
            self.frames.append(frame)
            self.seq = (self.seq + 1) & 0xFF
        if v.reboot_pending:  # after the ACK went out: off the air, as the vehicle's link does it
            v.reboot_pending = False
            v.out.clear()
            self.rebooting_until = self.now + REBOOT_S

    def upload(self, mission_type: int, items: list[tuple[int, int, tuple[float, ...], int, int, float]]) -> None:
        """MISSION_COUNT then every item in order (frame, command, params, x, y, z), as a ground station answers
        the vehicle's requests."""
        self.send(R.MAVLink_mission_count_message(self.v.sysid, 1, len(items), mission_type))
        for seq, (frame, command, p, x, y, z) in enumerate(items):
            params = [*p, *[0.0] * (4 - len(p))]
            self.send(R.MAVLink_mission_item_int_message(
                self.v.sysid, 1, seq, frame, command, 0, 1, *params, x, y, z, mission_type))  # fmt: skip

    def download(self, mission_type: int, count: int) -> None:
        self.send(R.MAVLink_mission_request_list_message(self.v.sysid, 1, mission_type))
        for seq in range(count):
            self.send(R.MAVLink_mission_request_int_message(self.v.sysid, 1, seq, mission_type))
        self.send(R.MAVLink_mission_ack_message(self.v.sysid, 1, 0, mission_type))

    def param_set(self, name: str, value: float, ptype: int = R.MAV_PARAM_TYPE_REAL32) -> None:
        self.send(R.MAVLink_param_set_message(self.v.sysid, 1, name.encode(), value, ptype))

    def interval(self, msg_id: int, hz: float) -> None:
        self.long(R.MAV_CMD_SET_MESSAGE_INTERVAL, msg_id, 1e6 / hz)

    def result(self) -> dict[str, Any]:
        data = b"".join(self.frames)
        return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "frames": len(self.frames)}


def _deg7(lat: float, lon: float, north_m: float, east_m: float) -> tuple[int, int]:
    dlat = north_m / 111_320.0
    dlon = east_m / (111_320.0 * math.cos(math.radians(lat)))
    return round((lat + dlat) * 1e7), round((lon + dlon) * 1e7)


def ardupilot() -> dict[str, Any]:
    """ArduCopter: boot, streams, params, uploads, GUIDED flight, AUTO, failsafes, logs, terrain, reboot."""
    r = Rig("ardupilot", terrain_preloaded=False)
    rel = R.MAV_FRAME_GLOBAL_RELATIVE_ALT_INT
    r.run(0.5)
    r.send(R.MAVLink_heartbeat_message(R.MAV_TYPE_GCS, R.MAV_AUTOPILOT_INVALID, 0, 0, 0, 3))
    r.send(R.MAVLink_request_data_stream_message(1, 1, 0, 4, 1))  # ALL at 4 Hz
    r.interval(R.MAVLINK_MSG_ID_GLOBAL_POSITION_INT, 10)
    r.interval(R.MAVLINK_MSG_ID_ATTITUDE, 10)
    r.interval(R.MAVLINK_MSG_ID_HOME_POSITION, 0.5)
    r.long(R.MAV_CMD_COMPONENT_ARM_DISARM, 1)  # refused during BOOT, text before the ACK
    r.send(R.MAVLink_set_mode_message(1, R.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED, 4))  # overridden by the boot
    r.run(4.0)
    r.long(R.MAV_CMD_COMPONENT_ARM_DISARM, 1)  # STABILIZE, the EKF settled: armed
    r.long(R.MAV_CMD_COMPONENT_ARM_DISARM, 0)
    r.send(R.MAVLink_param_request_list_message(1, 1))
    r.send(R.MAVLink_param_request_read_message(1, 1, b"RTL_ALT", -1))
    r.send(R.MAVLink_param_request_read_message(1, 1, b"", 3))
    r.param_set("RTL_ALT", 2500.0, R.MAV_PARAM_TYPE_INT32)
    r.param_set("NO_SUCH_PARAM", 1.0)
    r.send(R.MAVLink_timesync_message(0, 123_456_789))
    r.long(R.MAV_CMD_REQUEST_MESSAGE, R.MAVLINK_MSG_ID_AUTOPILOT_VERSION)
    r.long(R.MAV_CMD_REQUEST_AUTOPILOT_CAPABILITIES, 1)
    r.long(R.MAV_CMD_GET_MESSAGE_INTERVAL, R.MAVLINK_MSG_ID_ATTITUDE)
    r.long(R.MAV_CMD_REQUEST_MESSAGE, R.MAVLINK_MSG_ID_HOME_POSITION)
    r.long(R.MAV_CMD_SET_MESSAGE_INTERVAL, 9999, 1e5)  # not modelled: FAILED
    r.long(31999)  # unknown command
    lat7, lon7 = _deg7(HOME[0], HOME[1], 0.0, 0.0)
    wp1 = _deg7(HOME[0], HOME[1], 60.0, 0.0)
    wp2 = _deg7(HOME[0], HOME[1], 60.0, 60.0)
    r.upload(MISSION, [
        (R.MAV_FRAME_GLOBAL, R.MAV_CMD_NAV_WAYPOINT, (), lat7, lon7, HOME[2]),
        (rel, R.MAV_CMD_NAV_TAKEOFF, (), 0, 0, 15.0),
        (rel, R.MAV_CMD_NAV_WAYPOINT, (2.0,), *wp1, 20.0),
        (R.MAV_FRAME_MISSION, R.MAV_CMD_DO_CHANGE_SPEED, (1.0, 8.0, -1.0), 0, 0, 0.0),
        (rel, R.MAV_CMD_NAV_WAYPOINT, (0.0, 0.0, 0.0, math.nan), *wp2, 25.0),
        (rel, R.MAV_CMD_NAV_LOITER_TIME, (3.0,), *wp1, 20.0),
        (R.MAV_FRAME_MISSION, R.MAV_CMD_NAV_RETURN_TO_LAUNCH, (), 0, 0, 0.0),
    ])  # fmt: skip
    r.download(MISSION, 7)
    fence = [_deg7(HOME[0], HOME[1], n, e) for n, e in ((-300, -300), (-300, 300), (300, 300), (300, -300))]
    r.upload(FENCE, [(R.MAV_FRAME_GLOBAL, R.MAV_CMD_NAV_FENCE_POLYGON_VERTEX_INCLUSION, (4.0,), x, y, 0.0) for x, y in fence])
    r.upload(RALLY, [(rel, R.MAV_CMD_NAV_RALLY_POINT, (), *wp1, 30.0)])
    r.download(FENCE, 4)
    r.send(R.MAVLink_terrain_check_message(lat7, lon7))
    # GUIDED: arm, take off, reposition, a retransmission, change speed
    r.send(R.MAVLink_set_mode_message(1, R.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED, 4))
    r.long(R.MAV_CMD_COMPONENT_ARM_DISARM, 1)
    r.long(R.MAV_CMD_NAV_TAKEOFF, 0, 0, 0, 0, 0, 0, 20.0, confirmation=0)
    r.long(R.MAV_CMD_NAV_TAKEOFF, 0, 0, 0, 0, 0, 0, 20.0, confirmation=1)  # a retransmission: answered again
    r.run(6.0)
    r.long(R.MAV_CMD_COMPONENT_ARM_DISARM, 0)  # in the air: FAILED
    r.int_cmd(R.MAV_CMD_DO_REPOSITION, rel, -1.0, 1.0, x=wp2[0], y=wp2[1], z=30.0)
    r.long(R.MAV_CMD_DO_CHANGE_SPEED, 1, 7.0)
    r.run(8.0)
    r.long(R.MAV_CMD_DO_REPOSITION, 3.0, 0, 0, 0, HOME[0], HOME[1], 20.0)
    r.run(4.0)
    # AUTO from item 2, jump, then LOITER and back
    r.long(R.MAV_CMD_MISSION_START, 2)
    r.run(10.0)
    r.long(R.MAV_CMD_DO_SET_MISSION_CURRENT, 4)
    r.send(R.MAVLink_mission_set_current_message(1, 1, 2))
    r.run(25.0)
    r.long(R.MAV_CMD_DO_SET_MODE, R.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED, 5)  # LOITER
    r.run(2.0)
    r.long(R.MAV_CMD_DO_SET_MODE, R.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED, 99)  # unknown mode
    r.long(R.MAV_CMD_DO_SET_MODE, 0, 4)  # no custom flag
    r.long(R.MAV_CMD_DO_SET_MODE, R.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED, 4)  # GUIDED
    r.send(R.MAVLink_log_request_list_message(1, 1, 0, 0xFFFF))  # armed: one text, then silence
    # the battery failsafe: low → RTL, lands, disarms
    r.v.set_battery_pct(20.0)
    r.run(60.0)
    r.v.set_battery_pct(100.0)
    r.run(2.0)
    # logs while disarmed
    r.send(R.MAVLink_log_request_list_message(1, 1, 0, 0xFFFF))
    r.send(R.MAVLink_log_request_data_message(1, 1, 1, 0, 900))
    r.run(1.0)
    r.send(R.MAVLink_log_request_end_message(1, 1))
    # a forced result, then the fence: an altitude fence breached in GUIDED → RTL capped below it
    r.v.reject_next(R.MAV_CMD_COMPONENT_ARM_DISARM, R.MAV_RESULT_DENIED)
    r.long(R.MAV_CMD_COMPONENT_ARM_DISARM, 1)
    r.param_set("FENCE_TYPE", 5.0, R.MAV_PARAM_TYPE_INT8)
    r.param_set("FENCE_ALT_MAX", 25.0)
    r.long(R.MAV_CMD_DO_FENCE_ENABLE, 1)
    r.send(R.MAVLink_request_data_stream_message(1, 1, 2, 2, 1))  # EXTENDED_STATUS, with FENCE_STATUS now
    r.send(R.MAVLink_set_mode_message(1, R.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED, 4))
    r.long(R.MAV_CMD_COMPONENT_ARM_DISARM, 1)
    r.long(R.MAV_CMD_NAV_TAKEOFF, 0, 0, 0, 0, 0, 0, 40.0)
    r.run(70.0)
    r.long(R.MAV_CMD_DO_FENCE_ENABLE, 0)
    r.long(R.MAV_CMD_DO_SET_HOME, 1)
    r.long(R.MAV_CMD_DO_SET_HOME, 0, 0, 0, 0, HOME[0], HOME[1], HOME[2])
    r.long(R.MAV_CMD_GET_HOME_POSITION)
    r.send(R.MAVLink_mission_clear_all_message(1, 1, MISSION))
    r.run(2.0)
    # reboot: off the air, back as after power-on (streams asked again)
    r.long(R.MAV_CMD_PREFLIGHT_REBOOT_SHUTDOWN, 1)
    r.run(3.0)
    r.send(R.MAVLink_request_data_stream_message(1, 1, 0, 2, 1))
    r.run(5.0)
    r.long(R.MAV_CMD_COMPONENT_ARM_DISARM, 1)
    r.run(15.0)  # idle on the ground: DISARM_DELAY disarms it
    return r.result()


def px4() -> dict[str, Any]:
    """PX4: modes by main/sub, TEMPORARILY_REJECTED, bytewise params, takeoff → loiter, mission, RTL."""
    r = Rig("px4", seed=5, heartbeat_phase_s=0.7)
    rel = R.MAV_FRAME_GLOBAL_RELATIVE_ALT_INT
    custom = R.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED
    r.run(0.5)
    r.send(R.MAVLink_request_data_stream_message(1, 1, 0, 5, 1))
    r.interval(R.MAVLINK_MSG_ID_GLOBAL_POSITION_INT, 20)
    r.interval(R.MAVLINK_MSG_ID_VFR_HUD, 3)
    r.long(R.MAV_CMD_COMPONENT_ARM_DISARM, 1)  # no position yet: TEMPORARILY_REJECTED
    r.run(3.0)
    r.send(R.MAVLink_param_request_list_message(1, 1))
    r.param_set("RTL_ALT", 3000.0, R.MAV_PARAM_TYPE_REAL32)  # an INT param declared REAL32: PARAM_ERROR TYPE_MISMATCH
    r.send(R.MAVLink_param_request_read_message(1, 1, b"RTL_ALT", -1))
    r.long(R.MAV_CMD_REQUEST_MESSAGE, R.MAVLINK_MSG_ID_AUTOPILOT_VERSION)
    r.long(R.MAV_CMD_DO_SET_MODE, custom, 4, 0)  # AUTO sub 0: AUTO.MISSION, no mission
    r.long(R.MAV_CMD_DO_SET_MODE, custom, 4, 9)  # unknown AUTO sub mode
    r.long(R.MAV_CMD_DO_SET_MODE, custom, 42, 0)  # unknown main mode: ACCEPTED, nothing changes
    r.long(R.MAV_CMD_DO_SET_MODE, R.MAV_MODE_FLAG_MANUAL_INPUT_ENABLED | R.MAV_MODE_FLAG_STABILIZE_ENABLED)
    r.send(R.MAVLink_set_mode_message(1, custom, px4_custom(4, 3)))  # AUTO.LOITER through SET_MODE
    wp1 = _deg7(HOME[0], HOME[1], 40.0, 0.0)
    wp2 = _deg7(HOME[0], HOME[1], 40.0, -40.0)
    r.upload(MISSION, [
        (rel, R.MAV_CMD_NAV_TAKEOFF, (), 0, 0, 10.0),
        (rel, R.MAV_CMD_NAV_WAYPOINT, (1.0,), *wp1, 15.0),
        (rel, R.MAV_CMD_NAV_WAYPOINT, (), *wp2, 15.0),
        (R.MAV_FRAME_GLOBAL_TERRAIN_ALT_INT, R.MAV_CMD_NAV_WAYPOINT, (), *wp2, 15.0),  # refused frame
    ])  # fmt: skip
    r.upload(MISSION, [
        (rel, R.MAV_CMD_NAV_TAKEOFF, (), 0, 0, 10.0),
        (rel, R.MAV_CMD_NAV_WAYPOINT, (1.0,), *wp1, 15.0),
        (rel, R.MAV_CMD_NAV_WAYPOINT, (), *wp2, 15.0),
        (R.MAV_FRAME_MISSION, R.MAV_CMD_NAV_LAND, (), 0, 0, 0.0),
    ])  # fmt: skip
    r.download(MISSION, 4)
    r.long(R.MAV_CMD_COMPONENT_ARM_DISARM, 1)
    r.long(R.MAV_CMD_NAV_TAKEOFF, 0, 0, 0, 0, 0, 0, HOME[2] + 12.0)  # PX4: param7 above mean sea level
    r.run(6.0)
    r.long(R.MAV_CMD_COMPONENT_ARM_DISARM, 0)  # in the air: denied, with PX4's text
    r.int_cmd(R.MAV_CMD_DO_REPOSITION, rel, -1.0, 0.0, x=wp1[0], y=wp1[1], z=HOME[2] + 15.0)  # no change-mode flag
    r.int_cmd(R.MAV_CMD_DO_REPOSITION, rel, -1.0, 1.0, x=wp1[0], y=wp1[1], z=HOME[2] + 15.0)  # z AMSL, any frame
    r.run(8.0)
    r.long(R.MAV_CMD_MISSION_START, 0)
    r.run(30.0)
    r.long(R.MAV_CMD_NAV_TAKEOFF, 0, 0, 0, 0, 0, 0, 12.0)
    r.long(R.MAV_CMD_COMPONENT_ARM_DISARM, 1)
    r.long(R.MAV_CMD_NAV_TAKEOFF, 0, 0, 0, 0, 0, 0, 12.0)  # relative: "Already higher than takeoff altitude"
    r.send(R.MAVLink_param_request_read_message(1, 1, b"NOT_A_PARAM", -1))  # PARAM_ERROR DOES_NOT_EXIST
    r.long(R.MAV_CMD_NAV_TAKEOFF, 0, 0, 0, 0, 0, 0, HOME[2] + 12.0)
    r.run(5.0)
    r.long(R.MAV_CMD_NAV_RETURN_TO_LAUNCH)
    r.run(40.0)
    r.long(R.MAV_CMD_DO_SET_MODE, custom, 4, 6)  # AUTO.LAND on the ground
    r.long(R.MAV_CMD_COMPONENT_ARM_DISARM, 1)
    r.run(2.0)
    return r.result()


def ardupilot_sortie() -> dict[str, Any]:
    """ArduCopter flying the built-in sortie, a fast-draining battery, takeoff answered IN_PROGRESS."""
    r = Rig("ardupilot", seed=3, battery_drain_scale=25.0, boot_s=1.0,
            in_progress_commands=frozenset({R.MAV_CMD_NAV_TAKEOFF, R.MAV_CMD_DO_SET_HOME}))  # fmt: skip
    r.v.sortie = Sortie(index=3, seed=3)
    r.send(R.MAVLink_request_data_stream_message(1, 1, 0, 2, 1))
    r.interval(R.MAVLINK_MSG_ID_GLOBAL_POSITION_INT, 5)
    r.run(120.0)
    r.long(R.MAV_CMD_DO_SET_HOME, 1)  # IN_PROGRESS, its final answer a second later
    r.long(R.MAV_CMD_NAV_TAKEOFF, 0, 0, 0, 0, 0, 0, 10.0)  # in the air: FAILED; the sortie steps aside
    r.run(90.0)  # the battery failsafes land it
    r.v.set_battery_pct(100.0)
    r.send(R.MAVLink_set_mode_message(1, R.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED, 4))
    r.long(R.MAV_CMD_COMPONENT_ARM_DISARM, 1)
    r.long(R.MAV_CMD_NAV_TAKEOFF, 0, 0, 0, 0, 0, 0, 10.0)
    r.run(12.0)
    r.long(R.MAV_CMD_NAV_LAND)
    r.run(20.0)
    return r.result()


SCENARIOS: Final[dict[str, Callable[[], dict[str, Any]]]] = {
    "ardupilot": ardupilot,
    "px4": px4,
    "ardupilot_sortie": ardupilot_sortie,
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.sim.golden", description=__doc__)
    p.add_argument("--write", action="store_true", help="rewrite the fixture with what the simulator says now")
    args = p.parse_args(argv)
    results = {name: run() for name, run in SCENARIOS.items()}
    text = json.dumps(results, indent=2, sort_keys=True) + "\n"
    if args.write:
        FIXTURE.write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
