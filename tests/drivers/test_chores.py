"""The links' chores on one loop timer (drivers/mavlink/chores.py), and a real link's heartbeat, watchdog and
stream checks run by it against a vehicle played over loopback TCP."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import anyio
import pytest

from mavjet.drivers.mavlink import chores as chores_mod
from mavjet.drivers.mavlink.chores import Chores
from mavjet.drivers.mavlink.codec import MavCodec
from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.drivers.mavlink.link import LinkConfig, LinkState, MavlinkLink
from mavjet.drivers.mavlink.transport import Endpoint


class _Job:
    def __init__(self, name: str, log: list[str], every_s: float | None, times: int = 1_000) -> None:
        self.name, self.log, self.every_s, self.left = name, log, every_s, times

    def run(self, now: float) -> float | None:
        self.log.append(self.name)
        self.left -= 1
        if self.every_s is None or self.left == 0:
            return None
        return now + self.every_s


class _Broken:
    def __init__(self) -> None:
        self.runs = 0

    def run(self, now: float) -> float | None:
        self.runs += 1
        raise RuntimeError("a bug in one link's chores")


async def test_jobs_run_when_due_in_due_order_and_leave_when_they_say() -> None:
    loop = asyncio.get_running_loop()
    c = Chores.for_loop(loop)
    log: list[str] = []
    now = time.monotonic()
    c.add(_Job("late", log, None), now + 0.08)
    c.add(_Job("early", log, None), now + 0.02)
    c.add(_Job("every", log, 0.03, times=3), now)
    with anyio.fail_after(5):
        while len(log) < 5:  # bounded by fail_after
            await anyio.sleep(0.01)
    await anyio.sleep(0.1)
    assert Counter(log) == {"every": 3, "early": 1, "late": 1}  # each one-shot once, the repeating one its 3 times
    assert log.index("early") < log.index("late")
    assert len(c) == 0 and id(loop) not in Chores._by_loop  # nothing left: the loop's timer is gone too
    assert c.passes <= 6  # "every" and "early" fall due together at +0.03 and share a pass


async def test_a_failing_job_is_logged_retried_later_and_hurts_no_other(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chores_mod, "RETRY_AFTER_S", 0.05)
    c = Chores.for_loop(asyncio.get_running_loop())
    broken, log = _Broken(), []
    c.add(broken, time.monotonic())
    c.add(_Job("ok", log, 0.02, times=10), time.monotonic())
    with anyio.fail_after(5):
        while len(log) < 10:  # bounded by fail_after
            await anyio.sleep(0.01)
    assert broken.runs >= 2  # retried, not dropped
    assert broken.runs < 10  # but no faster than RETRY_AFTER_S, not in every pass
    broken.run = lambda now: None  # type: ignore[method-assign]  # the bug fixed: it leaves
    with anyio.fail_after(5):
        while len(c):  # bounded by fail_after
            await anyio.sleep(0.01)


class _Vehicle:
    """A vehicle over loopback TCP: an autopilot HEARTBEAT every `heartbeat_s` while `beating`; counts what it gets."""

    def __init__(self, heartbeat_s: float) -> None:
        self.heartbeat_s = heartbeat_s
        self.beating = True
        self.got: Counter[str] = Counter()
        self.gcs_heartbeats: list[float] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> _Vehicle:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        enc, dec = MavCodec(src_system=1, src_component=1), MavCodec()
        hb = mavlink2.MAVLink_heartbeat_message(mavlink2.MAV_TYPE_QUADROTOR, mavlink2.MAV_AUTOPILOT_ARDUPILOTMEGA,
                                                0, 0, mavlink2.MAV_STATE_STANDBY, 3)

        async def beat() -> None:
            for _ in range(1000):  # bounded: the test ends long before
                if self.beating:
                    w.write(enc.encode(hb))
                await asyncio.sleep(self.heartbeat_s)

        task = asyncio.create_task(beat())
        try:
            while data := await r.read(4096):
                for msg in dec.feed(data):
                    self.got[msg.get_type()] += 1
                    if msg.get_type() == "HEARTBEAT":
                        self.gcs_heartbeats.append(time.monotonic())
        finally:
            task.cancel()
            w.close()


async def test_a_link_beats_watches_and_asks_for_quiet_streams_on_the_loop_timer() -> None:
    cfg = LinkConfig(heartbeat_interval_s=0.2, heartbeat_timeout_s=0.6, stream_check_interval_s=0.1,
                     stream_stale_s=0.3, streams_hz={"ATTITUDE": 10.0})
    states: list[LinkState] = []
    async with _Vehicle(heartbeat_s=0.1) as vehicle:
        link = MavlinkLink(name="veh1", endpoint=Endpoint.parse(f"tcp:127.0.0.1:{vehicle.port}"), config=cfg,
                           on_messages=lambda msgs, recv_ns: None, on_state=lambda old, new: states.append(new))
        async with anyio.create_task_group() as tg:
            await tg.start(link.run)
            with anyio.fail_after(5):
                await link.wait_ready()
            tasks = {t.get_name() for t in asyncio.all_tasks()}
            assert "vehicle[veh1].link.heartbeat" not in tasks  # the epoll link's heartbeat is a chore, not a task
            assert len(Chores.for_loop(asyncio.get_running_loop())) >= 1
            await anyio.sleep(2.0)
            # ATTITUDE never comes: asked with SET_MESSAGE_INTERVAL once (no ACK: unsupported), then again
            # and again with REQUEST_DATA_STREAM, each time its 0.3 s bound passed.
            assert vehicle.got["COMMAND_LONG"] == 1
            assert vehicle.got["REQUEST_DATA_STREAM"] >= 2 * 5
            assert link.state is LinkState.UP
            vehicle.beating = False
            stopped = time.monotonic()
            with anyio.fail_after(5):
                while link.state is LinkState.UP:  # bounded by fail_after
                    await anyio.sleep(0.01)
            lost_after_s = time.monotonic() - stopped
            tg.cancel_scope.cancel()
    assert states[:3] == [LinkState.UP, LinkState.LOST, LinkState.DOWN]  # DOWN: the run cancelled at the end
    assert 0.45 <= lost_after_s <= 1.5  # the last heartbeat came up to 0.1 s before; the timeout is 0.6 s
    gaps = [b - a for a, b in zip(vehicle.gcs_heartbeats, vehicle.gcs_heartbeats[1:], strict=False)]
    assert len(gaps) >= 8
    assert 0.15 <= sorted(gaps)[len(gaps) // 2] <= 0.3  # the gateway's heartbeat every 0.2 s
    assert link.stats.heartbeats_skipped == 0
