"""`mavjet sim bench`: how many vehicles the simulator sustains at the gateway's rates.

Starts `mavjet sim --vehicles N --stats 1` as a separate process (pinned to
one core when the machine has two or more, this process on another),
connects one TCP client per vehicle, asks each vehicle for the gateway's
default rates with SET_MESSAGE_INTERVAL (position and attitude at
`--fast-hz`; SYS_STATUS, GPS_RAW_INT, BATTERY_STATUS, VFR_HUD,
EXTENDED_SYS_STATE and SYSTEM_TIME at `--slow-hz`; plus the 1 Hz heartbeat)
and measures over `--duration` seconds:

- the frames the sim wrote per second (its own counters, from `--stats`),
  against the requested rate;
- the bytes that reached the clients against the bytes the sim wrote (the
  receiving side only counts bytes, so it is not the bottleneck; the first
  64 KB of every connection are also framed and CRC-checked);
- the sim's CPU use, from /proc.

"Sustained" means at least 95 % of the requested rate is written and
delivered with no CRC errors. Prints one JSON object per fleet size.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from typing import Any

from fastcrc.crc16 import mcrf4xx as _crc
from pymavlink.dialects.v20 import ardupilotmega as mavlink2

from mavjet.sim.readyline import compiled_from_ready

FAST = (mavlink2.MAVLINK_MSG_ID_GLOBAL_POSITION_INT, mavlink2.MAVLINK_MSG_ID_ATTITUDE)
SLOW = (
    mavlink2.MAVLINK_MSG_ID_SYS_STATUS,
    mavlink2.MAVLINK_MSG_ID_GPS_RAW_INT,
    mavlink2.MAVLINK_MSG_ID_BATTERY_STATUS,
    mavlink2.MAVLINK_MSG_ID_VFR_HUD,
    mavlink2.MAVLINK_MSG_ID_EXTENDED_SYS_STATE,
    mavlink2.MAVLINK_MSG_ID_SYSTEM_TIME,
)


_CRC_EXTRA = {msg_id: cls.crc_extra for msg_id, cls in mavlink2.mavlink_map.items()}


class _Counter(asyncio.Protocol):
    """Counts MAVLink 2 frames and checks their CRC, at a fraction of a full parse's cost.

    The measuring side must be much cheaper than the sim it measures (both
    share a two-core machine), so frames are only delimited and CRC-checked.
    """

    CHECK_BYTES = 64 * 1024

    def __init__(self, sysid: int, requests: list[tuple[int, float]]) -> None:
        self.sysid = sysid
        self.requests = requests
        self.parser = mavlink2.MAVLink(None, 254, 190)
        self.frames = 0
        self.bad = 0
        self.bytes = 0
        self.buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        out = []
        for msg_id, hz in self.requests:
            cmd = mavlink2.MAVLink_command_long_message(
                self.sysid, 1, mavlink2.MAV_CMD_SET_MESSAGE_INTERVAL, 0, msg_id, 1e6 / hz, 0, 0, 0, 0, 0
            )
            out.append(cmd.pack(self.parser))
            self.parser.seq = (self.parser.seq + 1) % 256
        transport.write(b"".join(out))

    def data_received(self, data: bytes) -> None:
        self.bytes += len(data)
        if self.bytes - len(data) < self.CHECK_BYTES:
            self._check(data)

    def _check(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        i, n = 0, len(buf)
        while True:
            if i >= n:
                break
            if buf[i] != 0xFD:
                j = buf.find(b"\xfd", i)
                self.bad += 1
                if j < 0:
                    i = n
                    break
                i = j
            if i + 10 > n:
                break
            plen = buf[i + 1]
            end = i + 12 + plen + (13 if buf[i + 2] & 1 else 0)
            if end > n:
                break
            msg_id = buf[i + 7] | (buf[i + 8] << 8) | (buf[i + 9] << 16)
            extra = _CRC_EXTRA.get(msg_id)
            crc = buf[i + 10 + plen] | (buf[i + 11 + plen] << 8)
            if extra is None or _crc(buf[i + 1 : i + 10 + plen] + bytes((extra,)), 0xFFFF) != crc:
                self.bad += 1
                i += 1
                continue
            self.frames += 1
            i = end
        self.buf = buf[i:]


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def bench(vehicles: int, duration_s: float, fast_hz: float, slow_hz: float, warmup_s: float) -> dict[str, Any]:
    # -P passed on: run from a compiled copy (`PYTHONPATH=DIR python -P ...`, mavjet compile --sim), the
    # simulator measured must be that copy's, not the sources of whatever directory this runs in.
    safe_path = ["-P"] if sys.flags.safe_path else []
    cmd = [sys.executable, *safe_path, "-m", "mavjet.sim.cli", "--vehicles", str(vehicles), "--base-port", "0", "--stats", "1"]
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    stats: list[dict[str, Any]] = []
    new_stats = asyncio.Event()

    async def read_stats(stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            with contextlib.suppress(ValueError):
                stats.append(json.loads(line))
                new_stats.set()

    stats_task = asyncio.create_task(read_stats(proc.stderr))
    pinned = False
    own_cpus: set[int] | None = None
    if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= 2:
        own_cpus = os.sched_getaffinity(0)
        cpu_a, cpu_b = sorted(own_cpus)[:2]
        os.sched_setaffinity(proc.pid, {cpu_b})
        os.sched_setaffinity(0, {cpu_a})
        pinned = True
    endpoints: list[tuple[int, str, int]] = []
    compiled = 0
    try:
        async with asyncio.timeout(120):
            while True:
                line = (await proc.stdout.readline()).decode()
                if not line or line.startswith("ready"):
                    compiled = compiled_from_ready(line)  # a simulator whose tick path is compiled says so
                    break
                if not line.startswith("vehicle "):
                    continue
                parts = dict(kv.split("=", 1) for kv in line.split()[1:])
                _, host, port_s = parts["endpoint"].split(":")
                endpoints.append((int(parts["sysid"]), host, int(port_s)))
        requests = [(m, fast_hz) for m in FAST] + [(m, slow_hz) for m in SLOW]
        loop = asyncio.get_running_loop()
        counters: list[_Counter] = []
        for sysid, host, port in endpoints:
            proto = _Counter(sysid, requests)
            await loop.create_connection(lambda p=proto: p, host, port)  # type: ignore[misc]
            counters.append(proto)
        await asyncio.sleep(warmup_s)
        n0 = len(stats)
        b0, c0, t0 = sum(c.bytes for c in counters), _cpu_s(proc.pid), time.monotonic()
        await asyncio.sleep(duration_s)
        b1, c1, t1 = sum(c.bytes for c in counters), _cpu_s(proc.pid), time.monotonic()
        with contextlib.suppress(TimeoutError):  # the stats line covering the end of the window
            async with asyncio.timeout(10):
                while not stats or stats[-1]["t"] < t1:
                    new_stats.clear()
                    await new_stats.wait()
        window = [st for st in stats[max(n0 - 1, 0):] if t0 - 1.5 <= st["t"] <= t1 + 1.5]
        if len(window) < 2:
            return {"vehicles": len(counters), "sustained": False, "error": "the sim printed too few stats lines"}
        first, last = window[0], window[-1]
        span = last["t"] - first["t"]
        written = (last["frames_out"] - first["frames_out"]) / span
        written_bytes = (last["bytes_out"] - first["bytes_out"]) / span
        received_bytes = (b1 - b0) / (t1 - t0)
        expected = len(counters) * (len(FAST) * fast_hz + len(SLOW) * slow_hz + 1.0)
        bad = sum(c.bad for c in counters)
        return {
            "vehicles": len(counters),
            "duration_s": round(t1 - t0, 2),
            "requested_msgs_per_s": round(expected, 1),
            "sim_msgs_per_s": round(written, 1),
            "ratio": round(written / expected, 4),
            "delivered_bytes_ratio": round(received_bytes / written_bytes, 4) if written_bytes else 0.0,
            "crc_errors": bad,
            "checked_frames": sum(c.frames for c in counters),
            "sim_cpu_pct": round(100.0 * (c1 - c0) / (t1 - t0), 1),
            "sim_modules_compiled": compiled,
            "tick_overruns": last["overruns"],
            "sustained": written >= 0.95 * expected and received_bytes >= 0.95 * written_bytes and bad == 0,
            "pinned": pinned,
        }
    finally:
        if own_cpus is not None:
            os.sched_setaffinity(0, own_cpus)  # callers (tests) keep their CPUs
        stats_task.cancel()
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(20):
                    await proc.wait()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="mavjet sim bench", description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--vehicles", "-n", type=int, action="append", help="fleet size (repeat to try several)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds to count over (after warm-up)")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds before counting starts (default %(default)s)")
    p.add_argument("--fast-hz", type=float, default=10.0, help="position/attitude rate")
    p.add_argument("--slow-hz", type=float, default=2.0, help="rate of the other six messages")
    args = p.parse_args(argv)
    if any(n < 1 for n in args.vehicles or ()) or not (args.duration > 0 and args.warmup >= 0):
        p.error("--vehicles must be >= 1, --duration > 0 and --warmup >= 0")
    if not (args.fast_hz > 0 and args.slow_hz > 0):
        p.error("--fast-hz and --slow-hz must be > 0")
    for n in args.vehicles or [100]:
        result = asyncio.run(bench(n, args.duration, args.fast_hz, args.slow_hz, args.warmup))
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
