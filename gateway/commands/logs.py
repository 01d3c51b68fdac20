"""Flight-log downloads into TWIN_LOGS, run beside the command queue.

A vehicle's commands run one at a time (the consumer's MaxAckPending is 1),
and a log takes seconds to minutes: run inside the command it would hold
every `set_mode` behind it. So the `log_download` command only checks and
starts (its `cmd_result` is `accepted` once the log is found and the vehicle
disarmed) and emits `log_download_started`; this service, subscribed to the
vehicle's events, runs the download in its own task and reports
`log_download_progress {log_id, bytes, total}` (at most every
`progress_interval_s`), then `log_downloaded {log_id, object, size_bytes,
sha256, kib_s, ...}` or `log_download_failed {log_id, reason, bytes}`.

Interruptions do not start over: the session downloads window by window and
the bytes received are kept, so a dropped link, a timeout or the vehicle
arming mid-download (ArduPilot stops sending while armed) pauses the
download, which resumes at the last received offset once the link is up and
the vehicle disarmed. It ends `log_download_failed` only when no byte arrived
for `stall_timeout_s`. The log is stored in TWIN_LOGS under the vehicle's
own subjects (`mavjet.gateway.stores.logstore.put_log`: hash-addressed chunks and a name
record `<log id>-<date>.bin`), which a vehicle credential may write, so a
log downloaded twice is sent once.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import structlog
from anyio.abc import TaskGroup, TaskStatus

from mavjet.contract.errors import LinkError
from mavjet.contract.events import EventType
from mavjet.drivers.mavlink.logs import DEFAULT_LOG_CONFIG, LogConfig, LogEntry, LogError
from mavjet.gateway.services import ServiceContext, VehicleHandle
from mavjet.gateway.stores.chunks import BlobError
from mavjet.gateway.stores.logstore import object_name as log_object_name
from mavjet.gateway.stores.logstore import put_log
from mavjet.gateway.twin.telemetry import Event

log = structlog.get_logger("mavjet.logs")

STARTED = EventType.LOG_DOWNLOAD_STARTED
PROGRESS = EventType.LOG_DOWNLOAD_PROGRESS
DONE = EventType.LOG_DOWNLOADED
FAILED = EventType.LOG_DOWNLOAD_FAILED
_POLL_S = 0.2  # how often a paused download looks at the link and the armed state


@dataclass(frozen=True, slots=True, kw_only=True)
class LogDownloadConfig:
    progress_interval_s: float = 0.5  # bounds the rate of log_download_progress events
    stall_timeout_s: float = 300.0  # no new byte for this long (link down, armed): the download fails
    protocol: LogConfig = DEFAULT_LOG_CONFIG


def object_name(vid: str, entry: LogEntry) -> str:
    """`logs/<vid>/<log id>-<UTC start, or "undated">.bin` (stored in TWIN_LOGS, gateway/stores/logstore.py)."""
    when = (datetime.fromtimestamp(entry.time_utc_s, UTC).strftime("%Y%m%dT%H%M%SZ")
            if entry.time_utc_s > 0 else "undated")
    return log_object_name(vid, f"{entry.log_id}-{when}.bin")


def started_data(vid: str, entry: LogEntry) -> dict[str, Any]:
    """The `log_download_started` event's fields (what the service needs to run it)."""
    return {"log_id": entry.log_id, "total": entry.size_bytes, "time_utc_s": entry.time_utc_s,
            "object": object_name(vid, entry)}


@dataclass(slots=True)
class _Run:
    log_id: int
    total: int
    object: str
    written: int = 0
    last_byte_mono: float = field(default_factory=time.monotonic)
    last_progress_mono: float = 0.0
    interruptions: int = 0


class LogDownloadService:
    """Runs the downloads `log_download` commands start, one per vehicle at a time."""

    def __init__(self, cfg: LogDownloadConfig | None = None) -> None:
        self.cfg = cfg or LogDownloadConfig()
        self._tg: TaskGroup | None = None
        self._running: set[str] = set()

    async def run(self, ctx: ServiceContext, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        unsubscribe = [v.subscribe(self._handler(ctx, v)) for v in ctx.vehicles.values()]
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                task_status.started()
                await anyio.sleep_forever()
        finally:
            for off in unsubscribe:
                off()
            self._tg = None

    def _handler(self, ctx: ServiceContext, vehicle: VehicleHandle) -> Callable[[Event], None]:
        return lambda ev: self._on_event(ctx, vehicle, ev)

    def _on_event(self, ctx: ServiceContext, vehicle: VehicleHandle, ev: Event) -> None:
        if ev.type != STARTED or self._tg is None:
            return
        d = ev.data
        run = _Run(int(d["log_id"]), int(d["total"]), str(d["object"]))
        if vehicle.vid in self._running:
            vehicle.emit(FAILED, log_id=run.log_id, reason="another log download is running", bytes=0)
            return
        self._running.add(vehicle.vid)
        self._tg.start_soon(self._download, ctx, vehicle, run, name=f"vehicle[{vehicle.vid}].log_download")

    async def _download(self, ctx: ServiceContext, vehicle: VehicleHandle, run: _Run) -> None:
        try:
            await self._download_to_blobs(ctx, vehicle, run)
        except Exception as exc:  # a failed download must end in an event, never stop the service
            vehicle.report_error("log_download")
            vehicle.emit(FAILED, log_id=run.log_id, reason=f"{type(exc).__name__}: {exc}"[:300], bytes=run.written)
        finally:
            self._running.discard(vehicle.vid)

    async def _download_to_blobs(self, ctx: ServiceContext, vehicle: VehicleHandle, run: _Run) -> None:
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="mavjet-log-") as tmp:
            path = Path(tmp) / "log.bin"
            with path.open("wb") as out:

                async def sink(offset_bytes: int, data: bytes) -> None:
                    out.write(data)  # one window (tens of kB): not worth a thread
                    run.written = offset_bytes + len(data)
                    run.last_byte_mono = now = time.monotonic()
                    if now - run.last_progress_mono >= self.cfg.progress_interval_s or run.written >= run.total:
                        run.last_progress_mono = now
                        vehicle.emit(PROGRESS, log_id=run.log_id, bytes=run.written, total=run.total)
                    await self._wait_until_disarmed(vehicle, run)

                while run.written < run.total:
                    try:
                        end = await vehicle.session.download_log(
                            run.log_id, run.total, sink, offset=run.written, config=self.cfg.protocol)
                    except (LogError, LinkError) as exc:
                        run.interruptions += 1
                        log.info("log_download_interrupted", vehicle=vehicle.vid, log_id=run.log_id,
                                 at_bytes=run.written, error=str(exc))
                        if not await self._wait_resumable(vehicle, run):
                            vehicle.emit(FAILED, log_id=run.log_id, bytes=run.written,
                                         reason=f"no data for {self.cfg.stall_timeout_s:g} s: {exc}")
                            return
                        continue
                    run.total = min(run.total, end)  # a file shorter than its LOG_ENTRY said ends early
            elapsed_s = max(time.monotonic() - t0, 1e-9)
            _nc, js = await ctx.jetstream()
            try:
                stored = await put_log(js, ctx.cfg.env, vehicle.vid, run.object.rsplit("/", 1)[-1], path,
                                       log_id=run.log_id, pacer=ctx.bulk)
            except BlobError as exc:
                vehicle.emit(FAILED, log_id=run.log_id, bytes=run.written, reason=f"storing {run.object}: {exc}")
                return
        vehicle.emit(DONE, log_id=run.log_id, object=run.object, content=f"sha256/{stored.sha256}",
                     size_bytes=stored.size_bytes, sha256=stored.sha256, kib_s=round(run.written / 1024 / elapsed_s, 1),
                     elapsed_s=round(elapsed_s, 3), interruptions=run.interruptions)

    async def _wait_until_disarmed(self, vehicle: VehicleHandle, run: _Run) -> None:
        if vehicle.telemetry.armed:
            vehicle.emit(PROGRESS, log_id=run.log_id, bytes=run.written, total=run.total, paused="armed")
            while vehicle.telemetry.armed:  # noqa: ASYNC110 - the telemetry model has no awaitable armed state
                await anyio.sleep(_POLL_S)
            run.last_byte_mono = time.monotonic()  # time spent armed is not a stall

    async def _wait_resumable(self, vehicle: VehicleHandle, run: _Run) -> bool:
        """Wait for a live link and a disarmed vehicle; False once stalled past `stall_timeout_s`."""
        while time.monotonic() - run.last_byte_mono < self.cfg.stall_timeout_s:
            if vehicle.telemetry.armed:
                await self._wait_until_disarmed(vehicle, run)
            if vehicle.session.is_up:
                return True
            await anyio.sleep(_POLL_S)
        return False
