"""`mavjet bench uplink`: commands and safety events over a thin uplink, with and without shaping.

Runs on this machine: a nats-server, the simulator (its own process) with N
vehicles streaming full telemetry, and a gateway in this process whose NATS
connection goes through a throttling proxy (benchmarks/linkproxy.py: by
default 64 kbit/s each way, 150 ms round trip; `--outage-s` cuts the link
once, a third into the window). While it streams, the window runs:

- a log download (`log_download`: the vehicle serves the log over MAVLink,
  the gateway uploads it to TWIN_LOGS in chunks: the bulk transfer);
- `failsafe` events injected at the twins (`emit`, as the telemetry model
  does), each measured from emit to seen by a subscriber on the server side;
- commands (`set_mode` to the current mode), each measured from publish to
  its `cmd_result` seen by the issuer (the command goes down the link, the
  result comes back up).

The same window runs twice against the same server and simulator: shaping
off (`[uplink] enabled = false`: the link measured, nothing shaped) then on.
After each window the gateway gets `--drain` seconds to deliver what is
late, then stops; a failsafe event neither seen nor still in the gateway's
spool is lost (must be 0). Subscribers are connected to the server
directly, not through the proxy.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import msgpack
from nats.aio.msg import Msg

from mavjet.benchmarks.commands import commands_ready
from mavjet.benchmarks.kit import (
    default_json,
    nats_and_sim,
    non_negative_float,
    percentile,
    positive_float,
    positive_int,
    report,
)
from mavjet.benchmarks.linkproxy import LinkProfile, LinkProxy, OutageKind
from mavjet.contract.natsconn import NatsOptions, open_client
from mavjet.contract.subjects import event_filter, state_filter
from mavjet.drivers.mavlink.transport import Endpoint
from mavjet.gateway.commands.consumer import CommandService
from mavjet.gateway.commands.logs import LogDownloadService
from mavjet.gateway.config import GatewayConfig, VehicleConfig
from mavjet.gateway.daemon import Gateway
from mavjet.gateway.publish.spool import Spool
from mavjet.gateway.publish.uplink import UplinkConfig
from mavjet.gateway.runtime import logs
from mavjet.ops.client import CommandClient
from mavjet.ops.natsserver import NatsServer
from mavjet.ops.provision import DEFINITIONS_DIR, load_definitions, provision

ENV = "bench"
SEQ_KEY = "bench_seq"


class Observer:
    """What reaches the server, seen from a direct connection: failsafe events by seq, state by channel."""

    def __init__(self) -> None:
        self.failsafe_ns: dict[int, int] = {}  # seq -> when seen
        self.state = 0
        self.state_age_ms: list[float] = []
        self.log_events: list[tuple[str, dict[str, Any]]] = []
        self.counting = False

    async def on_event(self, msg: Msg) -> None:
        etype = msg.subject.rsplit(".", 1)[-1]
        if etype not in ("failsafe", "log_downloaded", "log_download_failed"):
            return
        data = msgpack.unpackb(msg.data, raw=False, strict_map_key=False).get("data") or {}
        if etype == "failsafe" and SEQ_KEY in data:
            self.failsafe_ns.setdefault(int(data[SEQ_KEY]), time.time_ns())
        elif etype != "failsafe":
            self.log_events.append((etype, data))

    async def on_state(self, msg: Msg) -> None:
        if not self.counting:
            return
        self.state += 1
        env = msgpack.unpackb(msg.data, raw=False, strict_map_key=False)
        t = env.get("time")
        if isinstance(t, msgpack.Timestamp):
            self.state_age_ms.append((time.time_ns() - t.to_unix_nano()) / 1e6)


def _gateway(proxy_port: int, n: int, base: int, tmp: str, *, shaping: bool,
             uplink: UplinkConfig) -> tuple[Gateway, CommandService]:
    mode = "on" if shaping else "off"
    cfg = GatewayConfig(
        vehicles=tuple(VehicleConfig(vid=f"VID-{i + 1:04d}", endpoint=Endpoint.parse(f"tcp:127.0.0.1:{base + 10 * i}"))
                       for i in range(n)),
        nats=NatsOptions(servers=(f"nats://127.0.0.1:{proxy_port}",)), env=ENV, instance=f"bench-uplink-{mode}",
        state_dir=Path(tmp) / f"state-{mode}", startup_timeout_s=60.0, uplink=replace(uplink, enabled=shaping),
    )
    gw = Gateway(cfg)
    service = CommandService()
    gw.services.extend([service, LogDownloadService()])
    return gw, service


def _still_spooled(path: Path) -> set[int]:
    """The bench failsafe seqs the stopped gateway's spool still holds (late, not lost)."""
    spool = Spool(path, max_entries=1_000_000)
    try:
        rows = spool.peek_sync(1_000_000)
    finally:
        spool.close()
    out: set[int] = set()
    for e in rows:
        if e.subject.endswith(".evt.failsafe"):
            data = msgpack.unpackb(e.payload, raw=False, strict_map_key=False).get("data") or {}
            if SEQ_KEY in data:
                out.add(int(data[SEQ_KEY]))
    return out


async def phase(args: argparse.Namespace, server: NatsServer, base: int, tmp: str, *, shaping: bool) -> dict[str, Any]:
    n = args.vehicles
    profile = LinkProfile(rate_bps=args.rate_bps, delay_s=args.rtt_ms / 2000.0)
    obs = Observer()
    out: dict[str, Any] = {}
    direct = await open_client(server.url)
    await direct.subscribe(event_filter(ENV), cb=obs.on_event)
    await direct.subscribe(state_filter(ENV), cb=obs.on_state)
    emitted: dict[int, int] = {}
    cmd_lat: list[float] = []
    cmd_results: dict[str, int] = {}
    cmd_started = [0]
    async with LinkProxy(server.port, profile) as proxy:
        gw, service = _gateway(proxy.port, n, base, tmp, shaping=shaping, uplink=UplinkConfig(
            target_delay_s=args.target_delay_s, newest_only_delay_s=max(args.target_delay_s, args.newest_only_delay_s)))

        async def measure() -> None:
            try:
                await gw.ready.wait()
                await commands_ready(gw, service, 120.0)
                vids = list(gw.twins)
                print(f"shaping {'on' if shaping else 'off'}: gateway ready, {args.duration:g} s window", flush=True)
                async with CommandClient(direct, ENV, issuer="bench-uplink") as cc:
                    r = await cc.call(vids[0], "log_download", {"log": str(args.log)}, timeout_s=60)
                    out["log_download_command"] = str(r.result)
                    obs.counting = True
                    t0 = time.monotonic()
                    async with anyio.create_task_group() as tg:
                        async def command(i: int) -> None:
                            vid = vids[i % len(vids)]
                            c0 = time.perf_counter()
                            try:
                                res = await cc.call(vid, "set_mode", {"mode": gw.twins[vid].telemetry.mode or "STABILIZE"},
                                                    timeout_s=args.duration + args.drain)
                                key = str(res.result)
                                cmd_lat.append((time.perf_counter() - c0) * 1000.0)
                            except Exception as exc:  # a result that never came is a figure here
                                key = f"error:{type(exc).__name__}"
                            cmd_results[key] = cmd_results.get(key, 0) + 1

                        async def inject() -> None:
                            rng = random.Random(1)
                            i = 0
                            while time.monotonic() - t0 < args.duration:
                                vid = vids[i % len(vids)]
                                emitted[i] = time.time_ns()
                                gw.twins[vid].emit("failsafe", reason="bench", **{SEQ_KEY: i})
                                if args.cmd_rate > 0 and rng.random() < args.cmd_rate / args.failsafe_rate:
                                    cmd_started[0] += 1
                                    tg.start_soon(command, i)
                                i += 1
                                await anyio.sleep(1.0 / args.failsafe_rate)

                        async def outage() -> None:
                            await anyio.sleep(args.duration / 3)
                            print(f"  link cut for {args.outage_s:g} s", flush=True)
                            proxy.outage(args.outage_s, OutageKind.CUT)

                        tg.start_soon(inject)
                        if args.outage_s > 0:
                            tg.start_soon(outage)
                        await anyio.sleep(args.duration)
                        wall = time.monotonic() - t0
                        obs.counting = False
                        out["state_per_s"] = round(obs.state / wall, 1)
                        out["state_offered_per_s"] = n * sum(gw.cfg.rates_hz.values())
                        out["state_age_p50_ms"] = percentile(obs.state_age_ms, 0.5, digits=0)
                        out["state_age_p99_ms"] = percentile(obs.state_age_ms, 0.99, digits=0)
                        # the drain: late events and command results still count, new ones stop
                        for _ in range(int(args.drain * 10)):
                            if len(obs.failsafe_ns.keys() & emitted.keys()) >= len(emitted) \
                                    and sum(cmd_results.values()) >= cmd_started[0]:
                                break
                            await anyio.sleep(0.1)
                        tg.cancel_scope.cancel()
                out["uplink_level_end"] = int(gw.publisher.uplink.level)
                out["uplink_queue_delay_s_end"] = round(gw.publisher.uplink.est.queue_delay_s(time.monotonic_ns()), 2)
                cap = gw.publisher.uplink.est.capacity_bytes_s
                out["uplink_capacity_bytes_s"] = None if cap is None else round(cap)
                out["state_shed"] = gw.publisher.uplink.shed
            finally:
                gw.request_stop("bench done")

        async with anyio.create_task_group() as tg:
            tg.start_soon(measure)
            await gw.run()
        out["proxy_up_bytes"] = proxy.up.bytes
        out["proxy_connections"] = proxy.connections
    await direct.close()
    fs_lat = [(obs.failsafe_ns[s] - t) / 1e6 for s, t in emitted.items() if s in obs.failsafe_ns]
    spooled = _still_spooled(Path(tmp) / f"state-{'on' if shaping else 'off'}" / "spool.sqlite")
    missing = set(emitted) - set(obs.failsafe_ns)
    out |= {
        "failsafe_emitted": len(emitted),
        "failsafe_seen": len(set(emitted) & set(obs.failsafe_ns)),
        "failsafe_p50_ms": percentile(fs_lat, 0.5, digits=0),
        "failsafe_p99_ms": percentile(fs_lat, 0.99, digits=0),
        "failsafe_still_spooled": len(missing & spooled),
        "failsafe_lost": len(missing - spooled),
        "cmd_sent": cmd_started[0],
        "cmd_no_result_by_drain_end": cmd_started[0] - sum(cmd_results.values()),
        "cmd_results": cmd_results,
        "cmd_p50_ms": percentile(cmd_lat, 0.5, digits=0),
        "cmd_p99_ms": percentile(cmd_lat, 0.99, digits=0),
        # a core subscription sees a republished event again (the stream de-duplicates it): once each here
        "log": sorted({(k, str(d.get("size_bytes") or d.get("reason"))) for k, d in obs.log_events}),
    }
    return out


async def run(args: argparse.Namespace, server: NatsServer, base: int, tmp: str) -> dict[str, Any]:
    nc = await open_client(server.url)
    await provision(nc.jetstream(), load_definitions(DEFINITIONS_DIR, env=ENV, replicas=1))
    await nc.close()
    out: dict[str, Any] = {
        "vehicles": args.vehicles, "rate_bps": args.rate_bps, "rtt_ms": args.rtt_ms, "outage_s": args.outage_s,
        "duration_s": args.duration, "failsafe_per_s": args.failsafe_rate, "cmd_per_s": args.cmd_rate,
        "target_delay_s": args.target_delay_s, "newest_only_delay_s": args.newest_only_delay_s,
    }
    out["off"] = await phase(args, server, base, tmp, shaping=False)
    out["on"] = await phase(args, server, base, tmp, shaping=True)
    out["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mavjet bench uplink", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vehicles", type=positive_int, default=3, help="simulated vehicles streaming full telemetry")
    p.add_argument("--rate-bps", type=positive_int, default=64_000, help="link rate each way, bit/s (default %(default)s)")
    p.add_argument("--rtt-ms", type=non_negative_float, default=150.0, help="link round trip, ms (default %(default)s)")
    p.add_argument("--outage-s", type=non_negative_float, default=0.0, help="cut the link once for this long (0: no outage)")
    p.add_argument("--duration", type=positive_float, default=40.0, help="measurement window per phase, seconds")
    p.add_argument("--drain", type=non_negative_float, default=20.0, help="seconds after the window for late arrivals")
    p.add_argument("--failsafe-rate", type=positive_float, default=1.0, help="failsafe events injected per second")
    p.add_argument("--cmd-rate", type=non_negative_float, default=0.5, help="commands per second (at most --failsafe-rate)")
    p.add_argument("--log", type=int, default=1, help="the sim log to download (1: ~90 kB)")
    p.add_argument("--target-delay-s", type=positive_float, default=UplinkConfig().target_delay_s,
                   help="[uplink] target_delay_s for the shaped phase (default %(default)s)")
    p.add_argument("--newest-only-delay-s", type=positive_float, default=UplinkConfig().newest_only_delay_s,
                   help="[uplink] newest_only_delay_s for the shaped phase (default %(default)s)")
    p.add_argument("--json", type=Path, default=None, help="write results here "
                   "(default: benchmarks/results/uplink-STAMP.json in a checkout, docs/benchmarks.md)")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.cmd_rate > args.failsafe_rate:  # the option types check each figure alone
        print("mavjet bench uplink: --cmd-rate must be at most --failsafe-rate", file=sys.stderr)
        return 2
    logs.configure("warning")
    with nats_and_sim(args.vehicles, preferred_port=26860, prefix="mavjet-bench-uplink-") as (server, _sim, base, tmp):
        res = asyncio.run(run(args, server, base, tmp))
    report(res, args.json or default_json("uplink"))
    return 0
