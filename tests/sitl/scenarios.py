"""Scenarios that must pass against the simulator and against a real ArduCopter SITL alike.

Each takes a `Rig` (a real nats-server, an in-process gateway with the
command service, and the peer's vehicles) and drives it only through
TWIN_CMD and the gateway's twin, as an operator would, so the same function
judges `sim/` and the real autopilot.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from nats.aio.client import Client

from mavjet.contract.subjects import BLOBS_BUCKET
from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.drivers.mavlink.plan import parse_plan
from mavjet.gateway.commands.consumer import CommandService
from mavjet.gateway.commands.logs import LogDownloadConfig, LogDownloadService
from mavjet.gateway.daemon import Gateway
from mavjet.gateway.shadow.config import ShadowConfig
from mavjet.gateway.shadow.service import ShadowService
from mavjet.gateway.stores.logstore import fetch_log
from mavjet.ops.client import CommandClient, Result
from mavjet.ops.sortie import distance_m, offset_deg
from tests.sitl.peers import ARDUPILOT_NAMES, Names
from tests.support.commands import TEST_COMMANDS
from tests.support.gateway import ENV, collect_events, gateway_config, running
from tests.support.wait import wait_for

QGC_PLAN = Path(__file__).with_name("qgc_full.plan")
# The shadow tests' fast timings: a missed step is retried within seconds, drift read back every 3 s.
SHADOW_CONFIG = ShadowConfig(verify_interval_s=3.0, retry_initial_s=0.3, retry_max_s=2.0, resync_interval_s=2.0,
                             tick_s=0.2, confirm_s=3.0, request_timeout_s=1.0)


@dataclass
class Rig:
    gw: Gateway
    client: CommandClient
    nc: Client
    vids: list[str]

    async def call(self, vid: str, name: str, params: dict[str, Any] | None = None, *, timeout_s: float = 60.0) -> Result:
        return await self.client.call(vid, name, params, timeout_s=timeout_s, deadline_s=timeout_s)

    def model(self, vid: str) -> Any:
        return self.gw.twins[vid].model


@asynccontextmanager
async def gateway_on(nc: Client, url: str, endpoints: list[str], state_dir: Path, *, shadow: bool = False,
                     signing_key_file: Path | None = None, logs: bool = False) -> AsyncIterator[Rig]:
    """A gateway with the command service (and the shadow service when `shadow`, the log download service
    when `logs`) on `endpoints` (VID-001..N), signing every link with `signing_key_file` when given, ready for commands."""
    service = CommandService()
    cfg = gateway_config(url, endpoints, state_dir, commands=TEST_COMMANDS)
    if signing_key_file is not None:
        cfg = dataclasses.replace(cfg, vehicles=tuple(dataclasses.replace(vc, signing_key_file=signing_key_file)
                                                      for vc in cfg.vehicles))
    gw = Gateway(cfg)
    gw.services.append(service)
    if shadow:
        gw.services.append(ShadowService(SHADOW_CONFIG))
    if logs:
        gw.services.append(LogDownloadService(LogDownloadConfig(progress_interval_s=0.5, stall_timeout_s=60)))
    async with running(gw), CommandClient(nc, ENV, issuer="pytest-sitl") as client:
        await wait_for(lambda: len(service.lanes) == len(endpoints) and all(lp.binds for lp in service.lanes.values()),
                       timeout_s=30)
        yield Rig(gw=gw, client=client, nc=nc, vids=[f"VID-{i + 1:03d}" for i in range(len(endpoints))])


async def standby(rig: Rig, vid: str, timeout_s: float = 60.0) -> None:
    """Linked, state known and out of BOOT (a mode set during ArduPilot's BOOT is overridden when it becomes ready)."""
    twin = rig.gw.twins[vid]
    await wait_for(lambda: twin.link.is_up and twin.model.armed is not None
                   and twin.model.system_status not in (None, mavlink2.MAV_STATE_BOOT), timeout_s=timeout_s)


async def set_mode_when_possible(rig: Rig, vid: str, mode: str, within_s: float) -> None:
    """`set_mode` every second until accepted: the sim refuses a position mode before its EKF settles even
    when disarmed, while a real ArduCopter accepts GUIDED at STANDBY (recording boot_and_arm_refused_guided)."""
    deadline = time.monotonic() + within_s
    while not (r := await rig.call(vid, "set_mode", {"mode": mode})).accepted:
        assert time.monotonic() < deadline, f"set_mode {mode}: {r.result}: {r.detail}"
        await anyio.sleep(1.0)


async def arm_when_armable(rig: Rig, vid: str, within_s: float) -> list[Result]:
    """`arm` every 2 s until accepted (SITL refuses until its EKF uses GPS); returns every result."""
    tried: list[Result] = []
    deadline = time.monotonic() + within_s
    while True:
        r = await rig.call(vid, "arm")
        tried.append(r)
        if r.accepted:
            return tried
        assert time.monotonic() < deadline, f"not armable within {within_s} s: {[x.detail for x in tried][-3:]}"
        if r.data.get("flavour") == "px4":
            # PX4 answers TEMPORARILY_REJECTED and explains in its events protocol, not STATUSTEXT (README of the kit).
            assert r.result == "rejected" and r.mav_result == mavlink2.MAV_RESULT_TEMPORARILY_REJECTED, r
        else:
            # The refusal carries the vehicle's reasons ("Arm: ..." texts come after the ACK), never a bare MAV_RESULT.
            assert r.result == "failed" and r.detail.startswith("arm rejected: "), r
        await anyio.sleep(2.0)


async def until(what: str, pred: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        await anyio.sleep(0.2)


async def fly_guided(rig: Rig, vid: str, *, armable_within_s: float, alt_m: float = 10.0,
                     names: Names = ARDUPILOT_NAMES) -> None:
    """GUIDED (PX4: AUTO.LOITER), arm, take off, go 30 m north, RTL, landed and disarmed."""
    await standby(rig, vid)
    await set_mode_when_possible(rig, vid, names.guided, armable_within_s)
    await arm_when_armable(rig, vid, armable_within_s)
    # At once: an armed ArduCopter that does not take off disarms itself after DISARM_DELAY.
    r = await rig.call(vid, "takeoff", {"alt_m": alt_m})
    assert r.accepted, r
    m = rig.model(vid)
    await until("climb", lambda: (m.alt_m or 0.0) >= alt_m - 1.0, 60)
    # ...and not far above it (PX4 reads the takeoff altitude AMSL: the gateway sends home AMSL + alt_m).
    assert (m.alt_m or 0.0) <= alt_m + 3.0, m.alt_m
    lat, lon = offset_deg(m.lat_deg, m.lon_deg, 30.0, 0.0)
    assert (await rig.call(vid, "goto", {"lat_deg": lat, "lon_deg": lon, "alt_m": alt_m})).accepted
    await until("goto", lambda: distance_m(m.lat_deg, m.lon_deg, lat, lon) <= 3.0, 60)
    assert (await rig.call(vid, "rtl")).accepted
    await until("return, land and disarm", lambda: m.armed is False, 180)
    assert (m.alt_m or 0.0) < 1.0


def relocated(doc: bytes, lat_deg: float, lon_deg: float) -> bytes:
    """A QGroundControl plan moved as a whole so that its planned home is at (lat_deg, lon_deg): every item's
    position, the fence's polygons and circles and the rally points shift by the same offset."""
    plan = json.loads(doc)
    home = plan["mission"]["plannedHomePosition"]
    dlat, dlon = lat_deg - home[0], lon_deg - home[1]
    home[0], home[1] = lat_deg, lon_deg
    for item in plan["mission"]["items"]:
        p = item["params"]
        if item["frame"] != 2 and (p[4], p[5]) != (0, 0):  # frame 2 (MISSION): no position
            p[4], p[5] = round(p[4] + dlat, 7), round(p[5] + dlon, 7)
    for poly in plan["geoFence"]["polygons"]:
        poly["polygon"] = [[round(a + dlat, 7), round(b + dlon, 7)] for a, b in poly["polygon"]]
    for circle in plan["geoFence"]["circles"]:
        c = circle["circle"]["center"]
        circle["circle"]["center"] = [round(c[0] + dlat, 7), round(c[1] + dlon, 7)]
    plan["rallyPoints"]["points"] = [[round(a + dlat, 7), round(b + dlon, 7), z] for a, b, z in plan["rallyPoints"]["points"]]
    return json.dumps(plan).encode()


async def qgc_plan_for(rig: Rig, vid: str, names: Names) -> bytes:
    """The plan for this vehicle: as written (around ArduPilot SITL's home, where the sim starts too), or, for
    PX4 (SIH starts 16,000 km away), moved to where the vehicle is, fence and all."""
    if names.flavour != "px4":
        return QGC_PLAN.read_bytes()
    m = rig.model(vid)
    await until("a position", lambda: m.lat_deg is not None and (m.lat_deg, m.lon_deg) != (0.0, 0.0), 60)
    return relocated(QGC_PLAN.read_bytes(), m.lat_deg, m.lon_deg)


async def upload_qgc_plan(rig: Rig, vid: str, name: str = "missions/qgc_full.plan", *,
                          names: Names = ARDUPILOT_NAMES) -> Result:
    """A QGroundControl plan (null params, LOITER_TIME, DO_CHANGE_SPEED, RTL, LAND, polygon fence, circle
    exclusion, rally point) uploads, verifies against the vehicle's own read-back form, and enables the fence."""
    await standby(rig, vid)
    doc = await qgc_plan_for(rig, vid, names)
    store = await rig.nc.jetstream().object_store(BLOBS_BUCKET)
    await store.put(name, doc)
    plan = parse_plan(doc)
    r = await rig.call(vid, "mission_upload", {"object": name}, timeout_s=90.0)
    assert r.accepted, r
    assert (r.data["count"], r.data["fence_count"], r.data["rally_count"]) == (
        len(plan.mission), len(plan.fence), len(plan.rally))
    assert r.data["digest"] == plan.mission_digest
    assert r.data["fence_enabled"] is True
    if names.flavour == "ardupilot":  # PX4 has no switch: its fence is on while it holds zones
        got = await rig.call(vid, "param_get", {"name": "FENCE_ENABLE"})
        assert got.accepted and got.data["value"] == 1.0, got
    return r


async def two_vehicles(rig: Rig, *, armable_within_s: float, names: Names = ARDUPILOT_NAMES) -> None:
    """Two autopilots on one gateway: each answers its own commands, independently."""
    assert len(rig.vids) == 2
    for vid in rig.vids:
        await standby(rig, vid)
    a, b = rig.vids
    await set_mode_when_possible(rig, a, names.guided, armable_within_s)
    await set_mode_when_possible(rig, b, names.other_mode, armable_within_s)
    await until("modes", lambda: rig.model(a).mode == names.guided and rig.model(b).mode == names.other_mode, 10)
    param, *values = names.rtl_alt
    for vid, value in zip((a, b), values, strict=True):
        assert (await rig.call(vid, "param_set", {"name": param, "value": value})).accepted
    for vid, value in zip((a, b), values, strict=True):
        got = await rig.call(vid, "param_get", {"name": param})
        assert got.accepted and got.data["value"] == value, got
    await upload_qgc_plan(rig, b, names=names)
    await fly_guided(rig, a, armable_within_s=armable_within_s, names=names)


async def events_of(rig: Rig, vid: str, kind: str) -> list[dict[str, Any]]:
    return [d for _v, _t, d, _m in await collect_events(rig.nc, f"fleet.{ENV}.veh.{vid}.evt.{kind}")]


async def fly_qgc_mission(rig: Rig, vid: str, *, armable_within_s: float, names: Names = ARDUPILOT_NAMES) -> None:
    """The QGroundControl plan uploads verified, then flies in AUTO (armed and taken off in GUIDED, then
    MISSION_START, as ArduCopter refuses to arm in AUTO) through its items to RTL, landed and disarmed."""
    await upload_qgc_plan(rig, vid, names=names)
    store = await rig.nc.jetstream().object_store(BLOBS_BUCKET)
    plan = parse_plan(bytes((await store.get("missions/qgc_full.plan")).data or b""))
    await set_mode_when_possible(rig, vid, names.guided, armable_within_s)
    await arm_when_armable(rig, vid, armable_within_s)
    r = await rig.call(vid, "takeoff", {"alt_m": 10.0})  # at once: an idle armed copter disarms itself
    assert r.accepted, r
    m = rig.model(vid)
    await until("airborne", lambda: (m.alt_m or 0.0) >= 3.0, 60)
    r = await rig.call(vid, "mission_start")
    assert r.accepted, r
    await until(names.auto, lambda: m.mode == names.auto, 10)
    # The plan ends with RTL (then LAND, never reached: RTL lands and disarms).
    await until("mission flown, landed and disarmed", lambda: m.armed is False, 240)
    assert (m.alt_m or 0.0) < 1.0
    landed: list[dict[str, Any]] = []
    deadline = time.monotonic() + 15
    while not landed:
        assert time.monotonic() < deadline, "no `landed` event"
        landed = await events_of(rig, vid, "landed")
        await anyio.sleep(0.3)
    assert landed[-1]["max_alt_m"] >= 20.0, landed  # the plan's takeoff item climbed to 20 m
    reached = [d["seq"] for d in await events_of(rig, vid, "mission_item_reached")]
    # Every waypoint of the plan (after the home at seq 0) reached (a nav item followed at once by a DO item reports only the DO's seq).
    waypoints = [it.seq for it in plan.mission[1:] if it.command == mavlink2.MAV_CMD_NAV_WAYPOINT]
    assert set(waypoints) <= set(reached) | {s + 1 for s in reached}, (reached, waypoints)


def terrain_plan(lat_deg: float, lon_deg: float) -> bytes:
    """A QGroundControl plan: takeoff, then a waypoint 30 m above the terrain (frame 10) 100 m north of the vehicle."""
    item_lat, item_lon = offset_deg(lat_deg, lon_deg, 100.0, 0.0)
    doc = {"fileType": "Plan", "version": 1, "groundStation": "QGroundControl", "mission": {
        "version": 2, "firmwareType": 3, "vehicleType": 2, "plannedHomePosition": [lat_deg, lon_deg, 584.0],
        "items": [
            {"type": "SimpleItem", "command": 22, "frame": 3, "params": [0, 0, 0, None, 0, 0, 10],
             "autoContinue": True, "doJumpId": 1},
            {"type": "SimpleItem", "command": 16, "frame": 10, "params": [0, 0, 0, None, item_lat, item_lon, 30],
             "autoContinue": True, "doJumpId": 2},
        ]}}  # fmt: skip
    return json.dumps(doc).encode()


async def upload_terrain_plan(rig: Rig, vid: str, name: str = "missions/terrain.plan") -> Result:
    """The gateway asks the vehicle (TERRAIN_CHECK) before uploading a plan with a terrain-frame item."""
    await standby(rig, vid)
    m = rig.model(vid)
    await wait_for(lambda: m.lat_deg is not None, timeout_s=30)
    store = await rig.nc.jetstream().object_store(BLOBS_BUCKET)
    await store.put(name, terrain_plan(m.lat_deg, m.lon_deg))
    return await rig.call(vid, "mission_upload", {"object": name}, timeout_s=60.0)


async def terrain_plan_refused(rig: Rig, vid: str) -> None:
    """Without terrain data on the vehicle (no files, no ground station serving it) the plan is refused, naming the item."""
    r = await upload_terrain_plan(rig, vid)
    assert r.result == "rejected", r
    assert "mission.items[1]: NAV_WAYPOINT in a terrain frame (10)" in r.detail and "terrain data" in r.detail, r.detail


async def newest_log(rig: Rig, vid: str, *, settle_s: float, within_s: float) -> dict[str, Any]:
    """The vehicle's newest LOG_ENTRY once its size stops growing (ArduPilot keeps logging ~15 s of its
    time after a disarm, then closes the file)."""
    deadline = time.monotonic() + within_s
    last: dict[str, Any] | None = None
    while True:
        listed = await rig.call(vid, "log_list")
        assert listed.accepted, listed
        entries = listed.data["logs"]
        assert entries, f"{vid} lists no logs"
        newest = dict(max(entries, key=lambda e: int(e["log_id"])))
        if last is not None and (newest["log_id"], newest["size_bytes"]) == (last["log_id"], last["size_bytes"]):
            return newest
        assert time.monotonic() < deadline, f"the newest log kept growing: {newest}"
        last = newest
        await anyio.sleep(settle_s)


async def log_download_is_byte_identical(rig: Rig, vid: str, log_file: Callable[[int, int], bytes | None], *,
                                         armable_within_s: float,
                                         settle_s: float, names: Names = ARDUPILOT_NAMES) -> None:
    """Arm and disarm (ArduPilot and PX4 start a log at arming), then `log_list` and `log_download latest`:
    the object stored in TWIN_LOGS is byte for byte the file the vehicle holds."""
    await standby(rig, vid)
    await set_mode_when_possible(rig, vid, names.guided, armable_within_s)
    await arm_when_armable(rig, vid, armable_within_s)
    m = rig.model(vid)
    assert (await rig.call(vid, "disarm")).accepted
    await until("disarmed", lambda: m.armed is False, 30)
    entry = await newest_log(rig, vid, settle_s=settle_s, within_s=120)
    done = await events_of(rig, vid, "log_downloaded")
    r = await rig.call(vid, "log_download", {"log": "latest"})
    assert r.accepted and int(r.data["log_id"]) == int(entry["log_id"]), r
    deadline = time.monotonic() + 300
    while len(finished := await events_of(rig, vid, "log_downloaded")) == len(done):
        assert not await events_of(rig, vid, "log_download_failed"), "log_download failed"
        assert time.monotonic() < deadline, "log_download did not finish within 300 s"
        await anyio.sleep(1.0)
    stored_event = finished[-1]
    held = log_file(0, int(entry["log_id"]))
    # ArduPilot closes the log at the first LOG_REQUEST_DATA, flushing what it still buffered: the file may end
    # up longer than a LOG_ENTRY listed before (35 bytes on 4.8.0-dev); the download follows it to its end.
    assert held is not None and len(held) == int(stored_event["size_bytes"]) >= int(entry["size_bytes"]), (
        len(held or b""), stored_event, entry)
    name = str(stored_event["object"]).rsplit("/", 1)[-1]
    stored = await fetch_log(rig.nc.jetstream(), ENV, vid, name)
    assert stored == held


async def unknown_parameter_is_rejected(rig: Rig, vid: str) -> None:
    """A parameter the vehicle does not have ends `rejected`, "no such parameter": at once where the autopilot
    answers PARAM_ERROR (PX4, ArduCopter 4.8); after one read's timeout and a parameter list where it stays
    silent (ArduCopter 4.7, the sim), and at once from then on."""
    await standby(rig, vid)
    first = await rig.call(vid, "param_get", {"name": "NOT_A_PARAM"})
    assert first.result == "rejected" and "no such parameter" in first.detail, first
    t0 = time.monotonic()
    again = await rig.call(vid, "param_set", {"name": "ALSO_NOT_A_PARAM", "value": 1.0})
    assert again.result == "rejected" and "no such parameter" in again.detail, again
    assert time.monotonic() - t0 < 2.0, "the second unknown name took a timeout"
