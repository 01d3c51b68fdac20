"""Mission, fence and rally transfers over a live `MavPort`, and the geofence.

The transfer half of the runners (`runner.py` holds the shared driving loop,
commands and parameters): upload, download and clear run the sans-IO mission
machines; `upload_and_verify` checks items before sending (ArduPilot does not
roll back a refused upload), reads them back and compares the autopilot's
normalised forms (`normalise.py`).

mavjet's MISSION lists follow ArduPilot's layout: seq 0 is the home, the plan's
items follow from seq 1 (`plan.py`). PX4 has no home item: it stores item `seq`
at index `seq` and its navigator flies from index 0 (`mavlink_mission.cpp`,
`handle_mission_item_both`), so an uploaded home would be flown as a
waypoint. `to_vehicle` / `from_vehicle` convert between the two at the wire,
so plans, digests and verification keep one layout for every flavour.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace

import anyio

from mavjet.contract.errors import (
    ProtocolError,
)
from mavjet.drivers.mavlink.fence import Geofence
from mavjet.drivers.mavlink.mission import (
    FENCE,
    MISSION,
    MissionClear,
    MissionDownload,
    MissionItem,
    MissionRejected,
    MissionTimeout,
    MissionUpload,
    item_label,
    mission_type_name,
)
from mavjet.drivers.mavlink.modes import Flavour
from mavjet.drivers.mavlink.normalise import check_item, differences
from mavjet.drivers.mavlink.plan import digest
from mavjet.drivers.mavlink.port import MavPort
from mavjet.drivers.mavlink.runner import (
    DEFAULT_CONFIG,
    ProtocolConfig,
    drive,
    set_param,
    target_system_of,
)

# ---------------------------------------------------------------------------
# missions

_NAV_WAYPOINT = 16  # MAV_CMD_NAV_WAYPOINT


@dataclass(frozen=True, kw_only=True, slots=True)
class TransferReport:
    """How a mission transfer went (for logs and metrics)."""

    mission_type: int
    count: int
    resends: int
    ignored: int
    elapsed_ms: float


@asynccontextmanager
async def _held(lock: anyio.Lock | None) -> AsyncIterator[None]:
    """Hold the vehicle's transfer lock, when the caller owns one.

    An autopilot serves one mission transfer at a time and a second one resets
    the first, so a vehicle's transfers must be serialised. The lock belongs to
    whoever owns the vehicle (mavjet.drivers.mavlink.vehiclesession.VehicleSession), not to
    this module: the runners stay free of global state.
    """
    if lock is None:
        yield
    else:
        async with lock:
            yield


async def _run_transfer(
    port: MavPort, machine: MissionUpload | MissionDownload | MissionClear, config: ProtocolConfig
) -> float:
    started = time.monotonic()
    try:
        with anyio.fail_after(config.operation_timeout_s):
            async with port.listen(config.listen_buffer) as rx:
                await drive(port, machine, rx)
    except TimeoutError:
        raise MissionTimeout(machine.PROTOCOL, "the operation deadline", machine.retries) from None
    if machine.error is not None:
        raise machine.error
    return (time.monotonic() - started) * 1000.0


async def _upload(
    port: MavPort, items: Sequence[MissionItem], mission_type: int, config: ProtocolConfig
) -> TransferReport:
    machine = MissionUpload(
        target_system=target_system_of(port),
        target_component=port.target_component,
        mission_type=mission_type,
        config=config.mission,
        items=tuple(items),
    )
    elapsed = await _run_transfer(port, machine, config)
    return TransferReport(
        mission_type=mission_type, count=len(items), resends=machine.resends, ignored=machine.ignored, elapsed_ms=elapsed
    )


async def _download(port: MavPort, mission_type: int, config: ProtocolConfig) -> list[MissionItem]:
    machine = MissionDownload(
        target_system=target_system_of(port),
        target_component=port.target_component,
        mission_type=mission_type,
        config=config.mission,
    )
    await _run_transfer(port, machine, config)
    return list(machine.items)


async def upload_mission(
    port: MavPort,
    items: Sequence[MissionItem],
    mission_type: int = MISSION,
    *,
    config: ProtocolConfig = DEFAULT_CONFIG,
    lock: anyio.Lock | None = None,
    flavour: Flavour | str | None = None,
) -> TransferReport:
    """Upload `items` (mavjet's layout, seq 0..n-1) as `mission_type`, as the vehicle numbers them
    (`to_vehicle`, the inverse of what `download_mission` applies); raises MissionRejected,
    MissionTimeout, ProtocolError."""
    async with _held(lock):
        return await _upload(port, to_vehicle(items, mission_type, flavour), mission_type, config)


async def download_mission(
    port: MavPort,
    mission_type: int = MISSION,
    *,
    config: ProtocolConfig = DEFAULT_CONFIG,
    lock: anyio.Lock | None = None,
    flavour: Flavour | str | None = None,
) -> list[MissionItem]:
    """Read the vehicle's `mission_type` items back, in mavjet's layout (`from_vehicle`)."""
    async with _held(lock):
        return from_vehicle(await _download(port, mission_type, config), mission_type, flavour)


async def clear_mission(
    port: MavPort, mission_type: int = MISSION, *, config: ProtocolConfig = DEFAULT_CONFIG, lock: anyio.Lock | None = None
) -> None:
    async with _held(lock):
        machine = MissionClear(
            target_system=target_system_of(port),
            target_component=port.target_component,
            mission_type=mission_type,
            config=config.mission,
        )
        await _run_transfer(port, machine, config)


class MissionMismatch(ProtocolError):
    """The mission read back differs from the one uploaded (after read-back normalisation).

    `seq` and `detail` name the first item that differs and how, when the
    counts agree.
    """

    def __init__(
        self, mission_type: int, uploaded: str, downloaded: str, *, seq: int | None = None, detail: str = ""
    ) -> None:
        where = f" ({item_label(mission_type, seq)}: {detail})" if seq is not None else (f" ({detail})" if detail else "")
        super().__init__(
            "mission_verify",
            f"{mission_type_name(mission_type)} read back with digest {downloaded[:12]}, uploaded {uploaded[:12]}{where}",
        )
        self.mission_type = mission_type
        self.uploaded = uploaded
        self.downloaded = downloaded
        self.seq = seq
        self.detail = detail


def _no_home(mission_type: int, flavour: Flavour | str | None) -> bool:
    return mission_type == MISSION and flavour == Flavour.PX4


def to_vehicle(items: Sequence[MissionItem], mission_type: int, flavour: Flavour | str | None) -> list[MissionItem]:
    """`items` (home at seq 0 of a MISSION) as the vehicle numbers them: on PX4 without the home, from seq 0."""
    if not _no_home(mission_type, flavour):
        return list(items)
    return [replace(it, seq=it.seq - 1) for it in items if it.seq != 0]


def from_vehicle(items: Sequence[MissionItem], mission_type: int, flavour: Flavour | str | None) -> list[MissionItem]:
    """A download in mavjet's layout: on PX4 an empty home (all zero, as ArduPilot before it has one) is put
    at seq 0 and the vehicle's items follow from seq 1. The inverse of `to_vehicle` but for the home."""
    if not _no_home(mission_type, flavour):
        return list(items)
    home = MissionItem(seq=0, frame=0, command=_NAV_WAYPOINT, mission_type=MISSION)
    return [home, *(replace(it, seq=it.seq + 1) for it in items)]


def check_upload(items: Sequence[MissionItem], flavour: Flavour | str | None) -> None:
    """Raise MissionRejected, naming the item, for the first item the vehicle would refuse.

    Checked before anything is sent: ArduPilot truncates its stored mission
    to the new count at MISSION_COUNT and does not roll back a refused upload.
    """
    for item in items:
        problem = check_item(item, flavour or Flavour.GENERIC)
        if problem is not None:
            raise MissionRejected(
                "mission_upload", problem.result, item.mission_type, seq=problem.seq, why=problem.reason
            )


def compare_readback(
    sent: Sequence[MissionItem], back: Sequence[MissionItem], mission_type: int, flavour: Flavour | str | None
) -> None:
    """Raise MissionMismatch unless `back` is how an autopilot of `flavour` reads `sent` back.

    Both sides are normalised (`normalise.readback`); seq 0 of a MISSION is
    the vehicle's own home and is not compared. Without a known flavour the
    items are compared in the digest's form (the coarsest).
    """
    want, got = digest(sent), digest(back)
    if len(sent) != len(back):
        raise MissionMismatch(mission_type, want, got, detail=f"{len(back)} items read back, {len(sent)} sent")
    for a, b in zip(sent, back, strict=True):
        if mission_type == MISSION and a.seq == 0:
            continue
        diff = differences(a, b, flavour or Flavour.ARDUPILOT)
        if diff:
            raise MissionMismatch(mission_type, want, got, seq=a.seq, detail="; ".join(diff))


async def upload_and_verify(
    port: MavPort,
    items: Sequence[MissionItem],
    mission_type: int = MISSION,
    *,
    config: ProtocolConfig = DEFAULT_CONFIG,
    lock: anyio.Lock | None = None,
    flavour: Flavour | str | None = None,
) -> str:
    """Check, upload, download, compare normalised items; return the digest or raise.

    Raises MissionRejected (naming the item) when an item would be refused or
    the vehicle refuses one, MissionMismatch when the read-back differs.
    A missing final MISSION_ACK (lost on a lossy link) does not fail the
    upload here: the download decides whether the vehicle holds the mission.
    """
    items = [it if it.mission_type == mission_type else replace(it, mission_type=mission_type) for it in items]
    check_upload([it for it in items if it.seq != 0] if _no_home(mission_type, flavour) else items, flavour)
    async with _held(lock):
        try:
            await _upload(port, to_vehicle(items, mission_type, flavour), mission_type, config)
        except MissionTimeout as exc:
            if exc.stage != "MISSION_ACK":
                raise
        except MissionRejected as exc:
            if exc.seq is None or not _no_home(mission_type, flavour):
                raise
            # Name the item in mavjet's numbering (the vehicle's seq k is our seq k + 1).
            raise MissionRejected(exc.protocol, exc.result, mission_type, seq=exc.seq + 1) from exc
        back = from_vehicle(await _download(port, mission_type, config), mission_type, flavour)
    compare_readback(items, back, mission_type, flavour)
    return digest(back)


# ---------------------------------------------------------------------------
# geofence


async def apply_geofence(
    port: MavPort,
    fence: Geofence,
    *,
    config: ProtocolConfig = DEFAULT_CONFIG,
    lock: anyio.Lock | None = None,
    flavour: Flavour | str | None = None,
) -> str:
    """Upload and verify the FENCE zones, then set and confirm the fence parameters.

    Zones go first and the FENCE_ENABLE switch last, so a vehicle never
    enforces a half-written fence. Returns the zones' digest.
    """
    items = fence.items()
    fence_digest = await upload_and_verify(port, items, FENCE, config=config, lock=lock, flavour=flavour)
    params = fence.params()
    enable = params.pop("FENCE_ENABLE")
    for name, value in params.items():
        await set_param(port, name, value, config=config)
    await set_param(port, "FENCE_ENABLE", enable, config=config)
    return fence_digest
