"""How a vehicle moves: kinematics, landing, RTL and flying the AUTO mission.

Step functions over `mavjet.sim.state.VehicleState`; `physics(s, dt)` is the
per-step motion. Deliberately simple: straight lines at a constant speed,
climbs and descents at the WPNAV_/LAND_ rates, no wind, no acceleration.
AUTO follows ArduCopter: home at seq 0, DO_ items done at once, one
navigation item per step, and MISSION_ITEM_REACHED coalesced as a real
ArduCopter sends it. Cutting the motors (`disarm_now`) lives here too: a
landing ends in it, and the arming rules above (`mavjet.sim.control`) call it.
"""

from __future__ import annotations

import math
from typing import Final

from mavjet.sim import geo, telemetry
from mavjet.sim.consts import NAV_CMDS_MAX, R
from mavjet.sim.missionitem import SimMissionItem
from mavjet.sim.state import VehicleState, mission_view, mode_named, send, text

_GLOBAL_AMSL_FRAMES: Final = frozenset({R.MAV_FRAME_GLOBAL, R.MAV_FRAME_GLOBAL_INT})


def physics(v: VehicleState, dt: float) -> None:
    v.consumed_mah += v.current_a * dt / 3.6 * v.opts.battery_drain_scale
    if not v.armed:
        if v.alt_m > 0.0:  # motors off in the air: fall
            v.vd = 10.0
            v.alt_m = max(0.0, v.alt_m - 10.0 * dt)
            v.landed = v.alt_m <= 0.0
        else:
            v.vd = 0.0
        v.vn = v.ve = 0.0
        return
    if v.landed and v.takeoff_alt_m is None and not auto_wants_takeoff(v):
        v.vn = v.ve = v.vd = 0.0
        return
    behaviour = v.fmode.behaviour
    if v.takeoff_alt_m is not None:
        climb_to(v, v.takeoff_alt_m, dt)
        v.vn = v.ve = 0.0
        if v.alt_m >= v.takeoff_alt_m - 0.05:
            v.takeoff_alt_m = None
            if v.flavour.after_takeoff is not None and v.fmode.name == v.flavour.takeoff:
                v.fmode = mode_named(v, v.flavour.after_takeoff)
        return
    if behaviour == "guided" and v.target is not None:
        fly_to(v, *v.target, dt)
    elif behaviour == "rtl":
        rtl(v, dt, in_mission=False)
    elif behaviour == "land":
        land(v, dt)
    elif behaviour == "auto":
        auto(v, dt)
    else:
        v.vn = v.ve = v.vd = 0.0


def disarm_now(v: VehicleState, why: str) -> None:
    """Motors off now, whatever the vehicle is doing (`why` is counted in `stats.extra`)."""
    v.armed = False
    v.takeoff_alt_m = None
    v.vn = v.ve = v.vd = 0.0
    text(v, R.MAV_SEVERITY_INFO, "Disarming motors")
    v.stats.extra[f"disarm_{why}"] = v.stats.extra.get(f"disarm_{why}", 0) + 1


def speed(v: VehicleState) -> float:
    if v.speed_m_s is not None:
        return v.speed_m_s
    return max(v.params["WPNAV_SPEED"] / 100.0, 0.2)


def climb_to(v: VehicleState, alt_m: float, dt: float) -> None:
    dz = alt_m - v.alt_m
    rate = (v.params["WPNAV_SPEED_UP"] if dz > 0 else v.params["WPNAV_SPEED_DN"]) / 100.0
    step = max(rate, 0.1) * dt
    if abs(dz) <= step:
        v.alt_m = alt_m
        v.vd = -dz / dt if dt > 0 else 0.0
    else:
        v.alt_m += math.copysign(step, dz)
        v.vd = -math.copysign(max(rate, 0.1), dz)
    if v.alt_m > 0.05:
        v.landed = False


def fly_to(v: VehicleState, lat: float, lon: float, alt_m: float | None, dt: float) -> bool:
    """Move toward the point; True once within WPNAV_RADIUS horizontally and 0.5 m vertically."""
    n, e = geo.north_east(v.lat_deg, v.lon_deg, lat, lon)
    dist = math.hypot(n, e)
    step = speed(v) * dt
    if dist <= step:
        v.lat_deg, v.lon_deg = lat, lon
        v.vn = n / dt if dt > 0 else 0.0
        v.ve = e / dt if dt > 0 else 0.0
        dist = 0.0
    else:
        k = step / dist
        v.lat_deg, v.lon_deg = geo.offset(v.lat_deg, v.lon_deg, n * k, e * k)
        v.vn, v.ve = n * k / dt, e * k / dt
        dist -= step
    if dist > 0.5:
        v.heading_deg = geo.bearing_deg(n, e)
    if alt_m is not None:
        climb_to(v, alt_m, dt)
    else:
        v.vd = 0.0
    radius = max(v.params["WPNAV_RADIUS"] / 100.0, 0.1)
    return dist <= radius and (alt_m is None or abs(alt_m - v.alt_m) < 0.5)


def land(v: VehicleState, dt: float, lat: float | None = None, lon: float | None = None) -> bool:
    """Descend (toward lat/lon first when given); True on touchdown."""
    if lat is not None and lon is not None and geo.distance_m(v.lat_deg, v.lon_deg, lat, lon) > 0.5:
        fly_to(v, lat, lon, None, dt)
        return False
    v.vn = v.ve = 0.0
    high = v.params["LAND_SPEED_HIGH"] or v.params["WPNAV_SPEED_DN"]
    rate = (high if v.alt_m > 10.0 else v.params["LAND_SPEED"]) / 100.0
    v.vd = max(rate, 0.1)
    v.alt_m = max(0.0, v.alt_m - v.vd * dt)
    if v.alt_m <= 0.0:
        v.vd = 0.0
        v.landed = True
        v.landed_since = v.now
        if v.armed:
            disarm_now(v, "landed")
        return True
    return False


def rtl_start(v: VehicleState) -> None:
    rtl_alt = v.params["RTL_ALT"] / 100.0
    if v.params["FENCE_ENABLE"] and int(v.params["FENCE_TYPE"]) & 1:
        rtl_alt = min(rtl_alt, v.params["FENCE_ALT_MAX"] - max(v.params["FENCE_MARGIN"], 1.0))
    v.rtl_alt_m = max(v.alt_m, rtl_alt, 1.0)
    v.rtl_phase = "land" if v.landed or v.home is None else "climb"


def rtl(v: VehicleState, dt: float, *, in_mission: bool) -> bool:
    """One step of return-to-launch; True on touchdown."""
    home = v.home
    if v.rtl_phase == "climb":
        climb_to(v, v.rtl_alt_m, dt)
        v.vn = v.ve = 0.0
        if v.alt_m >= v.rtl_alt_m - 0.05:
            v.rtl_phase = "return"
        return False
    if v.rtl_phase == "return" and home is not None:
        if fly_to(v, home[0], home[1], None, dt) and geo.distance_m(v.lat_deg, v.lon_deg, home[0], home[1]) < 0.5:
            v.rtl_phase = "loiter"
            v.rtl_wait_until = v.now + v.params["RTL_LOIT_TIME"] / 1000.0
        return False
    if v.rtl_phase == "loiter":
        v.vn = v.ve = v.vd = 0.0
        if v.now >= v.rtl_wait_until:
            v.rtl_phase = "land"
        return False
    final = v.params["RTL_ALT_FINAL"] / 100.0
    if final > 0 and not in_mission:
        climb_to(v, final, dt)
        return False
    return land(v, dt)


def auto_start(v: VehicleState, seq: int) -> None:
    v.mission_seq = seq
    v.item_started = False
    v.item_hold_until = None
    v.mission_state = R.MISSION_STATE_ACTIVE


def set_mission_current(v: VehicleState, seq: int) -> bool:
    if not 0 < seq < len(mission_view(v)):
        return False
    v.mission_seq = seq
    v.item_started = False
    v.item_hold_until = None
    if v.mission_state == R.MISSION_STATE_COMPLETE:
        v.mission_state = R.MISSION_STATE_ACTIVE
    return True


def auto_wants_takeoff(v: VehicleState) -> bool:
    if v.fmode.behaviour != "auto" or v.mission_state != R.MISSION_STATE_ACTIVE:
        return False
    items = mission_view(v)
    return 0 < v.mission_seq < len(items) and items[v.mission_seq].command == R.MAV_CMD_NAV_TAKEOFF


def item_alt(v: VehicleState, item: SimMissionItem) -> float:
    return rel_alt(v, item.z, item.frame)


def rel_alt(v: VehicleState, z: float, frame: int) -> float:
    if frame in _GLOBAL_AMSL_FRAMES:
        base = v.home[2] if v.home is not None else v.ground_amsl_m
        return z - base
    return z


def auto(v: VehicleState, dt: float) -> None:
    # ArduPilot keeps one "item reached" slot that its telemetry sends later: a
    # navigation item followed at once by DO_ items is reported as the last DO_
    # item's seq only (MISSION_ITEM_REACHED coalescing, seen on a real ArduCopter).
    items = mission_view(v)
    reached: int | None = None
    for _ in range(len(items)):  # DO_ items complete instantly; bounded by the list
        if v.mission_state != R.MISSION_STATE_ACTIVE or not 0 < v.mission_seq < len(items):
            v.vn = v.ve = v.vd = 0.0
            break
        item = items[v.mission_seq]
        is_nav = item.command < NAV_CMDS_MAX
        if is_nav and reached is not None:
            break  # one navigation item per step
        if not v.item_started:
            v.item_started = True
            v.item_hold_until = None
            if item.command == R.MAV_CMD_NAV_RETURN_TO_LAUNCH:
                rtl_start(v)
        done = run_item(v, item, dt)
        if not done:
            break
        if is_nav:
            text(v, R.MAV_SEVERITY_INFO, f"Reached command #{item.seq}")
            reached = item.seq
        elif reached is not None and v.flavour.name == "ardupilot":
            reached = item.seq
        advance(v, len(items))
    if reached is not None:
        report_reached(v, reached)


def run_item(v: VehicleState, item: SimMissionItem, dt: float) -> bool:
    cmd = item.command
    if cmd >= NAV_CMDS_MAX:  # DO_/CONDITION_ commands
        if cmd == R.MAV_CMD_DO_CHANGE_SPEED and item.param2 > 0:
            v.speed_m_s = float(item.param2)
        return True
    if cmd == R.MAV_CMD_NAV_TAKEOFF:
        alt = max(item_alt(v, item), 1.0)
        if v.alt_m >= alt - 0.05:
            return True
        climb_to(v, alt, dt)
        v.vn = v.ve = 0.0
        return False
    if v.landed:  # ArduPilot will not leave the ground without a takeoff item
        v.vn = v.ve = v.vd = 0.0
        return False
    if cmd == R.MAV_CMD_NAV_LAND:
        lat = item.lat_deg if item.x or item.y else None
        lon = item.lon_deg if item.x or item.y else None
        return land(v, dt, lat, lon)
    if cmd == R.MAV_CMD_NAV_RETURN_TO_LAUNCH:
        return rtl(v, dt, in_mission=True)
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
            v.vn = v.ve = v.vd = 0.0
        else:
            lat = item.lat_deg if item.x or item.y else v.lat_deg
            lon = item.lon_deg if item.x or item.y else v.lon_deg
            arrived = fly_to(v, lat, lon, item_alt(v, item), dt)
        if not arrived:
            return False
        if cmd == R.MAV_CMD_NAV_LOITER_UNLIM:
            return False
        if v.item_hold_until is None:
            hold = item.param1 if cmd in (R.MAV_CMD_NAV_WAYPOINT, R.MAV_CMD_NAV_LOITER_TIME, R.MAV_CMD_NAV_DELAY) else 10.0
            v.item_hold_until = v.now + max(float(hold), 0.0)
        return v.now >= v.item_hold_until
    return True  # navigation commands the simulator does not model are skipped


def report_reached(v: VehicleState, seq: int) -> None:
    v.reached.append(seq)
    del v.reached[:-1000]
    send(v, R.MAVLink_mission_item_reached_message(seq))


def advance(v: VehicleState, count: int) -> None:
    v.item_started = False
    v.item_hold_until = None
    if v.mission_seq + 1 >= count:
        v.mission_state = R.MISSION_STATE_COMPLETE
        text(v, R.MAV_SEVERITY_INFO, "Mission complete")
    else:
        v.mission_seq += 1
    telemetry.send_mission_current(v)
