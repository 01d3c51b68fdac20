"""Flight-log download from the simulator's dataflash logs through `VehicleSession` (LOG_* protocol over TCP)."""

from __future__ import annotations

import hashlib
import time

import anyio
import pytest

from mavjet.drivers.mavlink.logs import LogConfig, LogTimeout
from mavjet.sim.logs import DISARM_TEXT, LOG_DATA_BYTES
from tests.drivers.simlink import wait_for
from tests.drivers.test_session_sim import sim_session


class Collect:
    """A sink that checks the bytes come in order."""

    def __init__(self) -> None:
        self.data = bytearray()

    async def __call__(self, offset_bytes: int, data: bytes) -> None:
        assert offset_bytes == len(self.data)
        self.data += data


async def test_list_and_download_is_byte_identical_and_reports_throughput() -> None:
    async with sim_session() as (session, v, _model):
        entries = await session.list_logs()
        assert [(e.log_id, e.size_bytes, e.time_utc_s) for e in entries] == [
            (lg.log_id, len(lg.data), lg.time_utc_s) for lg in v.logs.logs]
        latest = entries[-1]
        held = v.logs.logs[-1].data
        assert held[:3] == b"\xa3\x95\x80"  # a DataFlash FMT record first
        sink = Collect()
        bytes_before, t0 = v.link.bytes_out, time.monotonic()
        end = await session.download_log(latest.log_id, latest.size_bytes, sink)
        elapsed_s, wire_bytes = time.monotonic() - t0, v.link.bytes_out - bytes_before
        assert end == latest.size_bytes == len(sink.data)
        assert hashlib.sha256(sink.data).hexdigest() == hashlib.sha256(held).hexdigest()
        assert v.logs.requests[0] == (latest.log_id, 0, LogConfig().window_bytes)
        print(f"\nlog download over TCP (sim): {latest.size_bytes / 1024 / elapsed_s:.0f} KiB/s, "
              f"LOG_DATA payload / bytes on the wire = {latest.size_bytes / wire_bytes:.3f}")


async def test_resumes_from_the_last_received_offset_after_a_link_drop() -> None:
    async with sim_session() as (session, v, _model):
        entry = (await session.list_logs())[-1]
        sink = Collect()
        dropped: dict[str, int] = {}

        async def cut_midway() -> None:
            await wait_for(lambda: v.logs.frames_sent * LOG_DATA_BYTES > entry.size_bytes // 2, 20, "half sent")
            dropped.update(requests=len(v.logs.requests), sunk=len(sink.data))
            v.drop_link(1.5)

        async with anyio.create_task_group() as tg:
            tg.start_soon(cut_midway)
            await session.download_log(entry.log_id, entry.size_bytes, sink)
        after = v.logs.requests[dropped["requests"]:]
        assert after, "nothing was asked for after the drop"
        # Every request after the drop starts at or after what had arrived: nothing starts over.
        assert all(ofs >= dropped["sunk"] > 0 for _id, ofs, _n in after)
        assert sum(n for _id, _ofs, n in after) <= entry.size_bytes - dropped["sunk"] + LogConfig().window_bytes
        assert v.link.frames_link_down > 0
        assert hashlib.sha256(sink.data).digest() == hashlib.sha256(v.logs.logs[-1].data).digest()


async def test_a_download_resumes_from_an_offset() -> None:
    async with sim_session() as (session, v, _model):
        entry = (await session.list_logs())[0]
        held = v.logs.logs[0].data
        sink = Collect()
        sink.data += held[:10_000]
        end = await session.download_log(entry.log_id, entry.size_bytes, sink, offset=10_000)
        assert end == len(held) and bytes(sink.data) == held
        assert v.logs.requests[0][1] == 10_000


async def test_commands_are_not_blocked_by_a_download() -> None:
    async with sim_session() as (session, v, _model):
        entry = (await session.list_logs())[-1]
        took: list[float] = []

        async def set_mode_meanwhile() -> None:
            await wait_for(lambda: v.logs.frames_sent > 100, 20, "download started")
            t0 = time.monotonic()
            await session.set_mode("ALT_HOLD")
            took.append(time.monotonic() - t0)
            assert v.logs.active or v.logs.frames_sent * LOG_DATA_BYTES < entry.size_bytes + 10 * LOG_DATA_BYTES

        async with anyio.create_task_group() as tg:
            tg.start_soon(set_mode_meanwhile)
            await session.download_log(entry.log_id, entry.size_bytes, Collect())
        assert took and took[0] < 1.0


async def test_refused_while_armed_with_the_autopilots_reason() -> None:
    async with sim_session() as (session, v, _model):
        await wait_for(lambda: v.position_ok, 20, "position")
        await session.set_mode("GUIDED")
        await session.arm()
        assert v.armed
        with pytest.raises(LogTimeout):
            await session.list_logs(config=LogConfig(silence_s=0.2, max_attempts=2))
        assert (3, DISARM_TEXT) in v.statustexts
        assert v.logs.requests == []


async def test_a_transfer_pauses_while_armed_and_finishes_after_disarm() -> None:
    async with sim_session() as (session, v, _model):
        entry = (await session.list_logs())[-1]
        sink = Collect()
        await wait_for(lambda: v.position_ok, 20, "position")

        async def arm_midway() -> None:
            await wait_for(lambda: v.logs.frames_sent > 300, 20, "download started")
            v.armed = True  # armed by the pilot's radio: no command goes through the session
            sent = v.logs.frames_sent
            await anyio.sleep(0.4)
            assert v.logs.frames_sent == sent  # nothing streams while armed
            v.armed = False

        async with anyio.create_task_group() as tg:
            tg.start_soon(arm_midway)
            await session.download_log(entry.log_id, entry.size_bytes, sink)
        assert hashlib.sha256(sink.data).digest() == hashlib.sha256(v.logs.logs[-1].data).digest()


@pytest.mark.parametrize("frames_per_tick", [200, 2000])
async def test_throughput_over_tcp(frames_per_tick: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """KiB/s of a whole download and LOG_DATA payload / bytes on the wire (printed with -s).

    200 LOG_DATA per 50 ms tick is the sim's default rate (~350 KiB/s plus the burst on each request);
    at 2000 the sim is no longer the bound and the figure is the gateway side's.
    """
    import mavjet.sim.logs

    monkeypatch.setattr(mavjet.sim.logs, "FRAMES_PER_POLL", frames_per_tick)
    async with sim_session() as (session, v, _model):
        entry = (await session.list_logs())[-1]
        sink = Collect()
        wire_before, t0 = v.link.bytes_out, time.monotonic()
        await session.download_log(entry.log_id, entry.size_bytes, sink)
        elapsed_s, wire = time.monotonic() - t0, v.link.bytes_out - wire_before
        assert bytes(sink.data) == v.logs.logs[-1].data
        print(f"\n{frames_per_tick} LOG_DATA/tick: {entry.size_bytes} B in {elapsed_s:.3f} s = "
              f"{entry.size_bytes / 1024 / elapsed_s:.0f} KiB/s; payload/wire {entry.size_bytes / wire:.3f}; "
              f"frames lost to a slow reader {v.link.frames_slow_client}")
