"""`mavjet bench failover --kills 20`: two gateways for one vehicle, the owner killed again and again.

Two `mavjet gateway` processes serve VID-001 of a simulated vehicle (in this
process, so every command the vehicle executes is counted) on a fresh
nats-server, while a client sends `set_mode` every `--cmd-interval` seconds.
Each round SIGKILLs the current owner, times how long until the other one
holds the lease (takeover), the longest gap in the vehicle's state meanwhile,
and restarts the killed gateway as the new standby. Then `--handovers` rounds
of SIGTERM (a rolling update's clean stop): the time from the signal to the
standby owning the vehicle, and the state gap.

Commands: every command's one result by kind, and how many the vehicle
executed more than once (`executed_twice`).

Baseline, in the same run: today's code without ownership (`ownership = false`),
the same two gateways and kills (`--baseline-kills`). Both act; nothing is
taken over, so takeover time does not apply; state never stops (both publish
it), and commands executed twice are what ownership removes.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg

from mavjet.benchmarks.kit import (
    default_json,
    non_negative_int,
    percentile,
    positive_float,
    positive_int,
    report,
    stop_process,
    this_python,
)
from mavjet.contract.natsconn import open_client
from mavjet.contract.subjects import LEASES_BUCKET, lease_key
from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.gateway.commands.recovery import CONFIRMED_DETAIL
from mavjet.ops.client import CommandClient
from mavjet.ops.natsserver import NatsServer
from mavjet.ops.provision import DEFINITIONS_DIR, load_definitions, provision
from mavjet.sim.fleet import SimConfig, SimFleet

ENV = "bench"
VID = "VID-001"
CONFIG = """
ownership = {ownership}
[commands]
ack_wait_s = 4.0
backoff_s = []
ack_timeout_s = 0.5
retries = 3
nak_delay_s = 0.3
fetch_timeout_s = 1.0
in_progress_interval_s = 0.5
default_deadline_s = 30.0
"""
TAKEOVER_LIMIT_S = 30.0


@dataclass
class Pair:
    """The two gateway processes, by instance name."""

    url: str
    endpoint: str
    root: Path
    ownership: bool
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    starts: int = 0

    def start(self, name: str) -> None:
        cfg = self.root / f"{name}.toml"
        cfg.write_text(CONFIG.format(ownership="true" if self.ownership else "false"))
        self.starts += 1
        with (self.root / f"{name}-{self.starts}.log").open("wb") as log:
            self.procs[name] = subprocess.Popen(
                [*this_python(), "-m", "mavjet.ops", "gateway", "--config", str(cfg), "--nats", self.url,
                 "--env", ENV, "--state-dir", str(self.root / name), "--instance", name,
                 "--vehicle", f"{VID}={self.endpoint}", "--log-json"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def stop_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                stop_process(p, timeout_s=20)


async def holder(nc: Client) -> str | None:
    """The lease holder's instance name, None when nobody holds it."""
    try:
        msg = await nc.jetstream().get_msg(f"KV_{LEASES_BUCKET}",
                                           subject=f"$KV.{LEASES_BUCKET}.{lease_key(ENV, VID)}")
    except Exception:  # absent, or a moment without the server
        return None
    if not msg.data:
        return None
    name = json.loads(msg.data).get("instance")
    return str(name) if name else None


async def wait_holder(nc: Client, want: str, timeout_s: float) -> float | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await holder(nc) == want:
            return time.monotonic()
        await asyncio.sleep(0.01)
    return None


class States:
    """Arrival times of the vehicle's state messages (any channel)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    async def on_msg(self, _msg: Msg) -> None:
        self.times.append(time.monotonic())

    def max_gap(self, start: float, end: float) -> float | None:
        window = [t for t in self.times if start <= t <= end]
        if len(window) < 2:
            return None
        return max(b - a for a, b in itertools.pairwise(window))


async def commands(client: CommandClient, interval_s: float, sent: list[str], stop: asyncio.Event) -> None:
    modes = ("GUIDED", "LOITER")
    while not stop.is_set():
        sent.append(await client.publish(VID, "set_mode", {"mode": modes[len(sent) % 2]}))
        await asyncio.sleep(interval_s)


async def run_phase(server: NatsServer, fleet: SimFleet, root: Path, *, ownership: bool, kills: int,
                    handovers: int, cmd_interval_s: float) -> dict[str, Any]:
    pair = Pair(url=server.url, endpoint=fleet.endpoints[0], root=root, ownership=ownership)
    nc = await open_client(server.url)
    states = States()
    sub = await nc.subscribe(f"fleet.{ENV}.veh.{VID}.state.>", cb=states.on_msg)
    takeovers: list[float] = []
    gaps: list[float] = []
    handover_s: list[float] = []
    handover_gaps: list[float] = []
    sent: list[str] = []
    stop = asyncio.Event()
    v = fleet.vehicles[0]
    before = sum(1 for e in v.executions if e.command == mavlink2.MAV_CMD_DO_SET_MODE and e.executed)
    try:
        pair.start("gw-a")
        if ownership and await wait_holder(nc, "gw-a", 60) is None:
            raise SystemExit("mavjet bench failover: gw-a never owned the vehicle")
        pair.start("gw-b")
        await asyncio.sleep(3.0)  # b connected and standing by
        async with CommandClient(nc, ENV, issuer="bench-failover") as client:
            sender = asyncio.create_task(commands(client, cmd_interval_s, sent, stop))
            for k in range(kills + handovers):
                clean = k >= kills
                owner = (await holder(nc)) if ownership else ("gw-a" if k % 2 == 0 else "gw-b")
                if owner not in pair.procs:
                    raise SystemExit(f"mavjet bench failover: no owner before round {k + 1} ({owner!r})")
                other = "gw-b" if owner == "gw-a" else "gw-a"
                t0 = time.monotonic()
                pair.procs[owner].send_signal(signal.SIGTERM if clean else signal.SIGKILL)
                took = await wait_holder(nc, other, TAKEOVER_LIMIT_S) if ownership else None
                t1 = took or time.monotonic()
                await asyncio.sleep(1.5)
                gap = states.max_gap(t0 - 1.0, t1 + 1.5)
                label = "handover" if clean else "kill"
                if ownership and took is None:
                    raise SystemExit(f"mavjet bench failover: {other} did not take over within {TAKEOVER_LIMIT_S} s")
                if clean:
                    if took is not None:
                        handover_s.append(t1 - t0)
                    if gap is not None:
                        handover_gaps.append(gap)
                else:
                    if took is not None:
                        takeovers.append(t1 - t0)
                    if gap is not None:
                        gaps.append(gap)
                print(f"  {label} {k + 1}: {owner} -> {other}"
                      + (f" in {t1 - t0:.2f} s" if took else "") + (f", state gap {gap:.2f} s" if gap else ""),
                      flush=True)
                pair.procs[owner].wait(timeout=30)
                pair.start(owner)  # back as the standby
                await asyncio.sleep(3.0)
            stop.set()
            await sender
            await asyncio.sleep(8.0)  # the last commands' results (a redelivery takes the ack wait)
            results: dict[str, int] = {}
            for cmd_id in sent:
                r = client.result(cmd_id, VID)
                kind = r.result if r is not None else "no result yet"
                if r is not None and r.detail == CONFIRMED_DETAIL:  # in flight at a kill, settled by the next owner
                    kind = f"{kind} (confirmed by the next owner)"
                results[str(kind)] = results.get(str(kind), 0) + 1
    finally:
        stop.set()
        pair.stop_all()
        await sub.unsubscribe()
        await nc.close()
    executed = sum(1 for e in v.executions if e.command == mavlink2.MAV_CMD_DO_SET_MODE and e.executed) - before
    accepted = results.get("accepted", 0)
    return {
        "ownership": ownership, "kills": kills, "handovers": handovers if ownership else 0,
        "takeover_p50_s": percentile(takeovers, 0.5), "takeover_p99_s": percentile(takeovers, 0.99),
        "takeover_max_s": round(max(takeovers), 3) if takeovers else None,
        "state_gap_p50_s": percentile(gaps, 0.5), "state_gap_max_s": round(max(gaps), 3) if gaps else None,
        "handover_p50_s": percentile(handover_s, 0.5),
        "handover_max_s": round(max(handover_s), 3) if handover_s else None,
        "handover_state_gap_max_s": round(max(handover_gaps), 3) if handover_gaps else None,
        "commands": len(sent), "results": results,
        # The vehicle's set_mode executions beyond one per accepted command (retransmissions of one
        # attempt the autopilot de-duplicates are not executions; a second delivery run again is).
        "executed_twice": max(0, executed - accepted),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = tempfile.TemporaryDirectory(prefix="mavjet-bench-failover-")
    server = NatsServer(store_dir=f"{tmp.name}/js")
    server.start()
    try:
        nc = await open_client(server.url)
        await provision(nc.jetstream(), load_definitions(DEFINITIONS_DIR, env=ENV, replicas=1))
        await nc.close()
        async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=1.0)) as fleet:
            out: dict[str, Any] = {}
            for name, own, kills, handovers in (("ownership", True, args.kills, args.handovers),
                                                ("baseline_no_ownership", False, args.baseline_kills, 0)):
                if kills + handovers == 0:
                    continue
                root = Path(tmp.name) / name
                root.mkdir()
                print(f"{name}: {kills} kills, {handovers} handovers", flush=True)
                out[name] = await run_phase(server, fleet, root, ownership=own, kills=kills, handovers=handovers,
                                            cmd_interval_s=args.cmd_interval)
            return out
    finally:
        server.cleanup()
        tmp.cleanup()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mavjet bench failover", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kills", type=positive_int, default=20, help="owners SIGKILLed (default %(default)s)")
    p.add_argument("--handovers", type=non_negative_int, default=5, help="owners stopped cleanly (SIGTERM)")
    p.add_argument("--baseline-kills", type=non_negative_int, default=6,
                   help="kills without ownership, today's code (default %(default)s; 0: none)")
    p.add_argument("--cmd-interval", type=positive_float, default=0.5, help="seconds between commands")
    p.add_argument("--json", type=Path, default=None, help="write results here "
                   "(default: benchmarks/results/failover-STAMP.json in a checkout, docs/benchmarks.md)")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if os.name != "posix":
        raise SystemExit("mavjet bench failover: needs POSIX signals")
    result = asyncio.run(run(args))
    report(result, args.json or default_json("failover"))
    return 0
