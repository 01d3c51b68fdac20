"""`mavjet bench shadow`: time from a desired write to `reported.converged`, and KV rates.

Runs on this machine, in one process: a nats-server (temporary store), the
simulated fleet, and a gateway with the shadow extension. Each round writes
a params change into every vehicle's `desired` at once and waits until each
`reported` says converged for that revision (seen through a KV watch on a
second connection, so the time includes the watch delivery the operator
would see). The same run measures a bare KV put and get round trip one at
a time, the baseline the ratio is against.

    mavjet bench shadow --vehicles 10 --rounds 20 --json shadow-10.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import nats

from mavjet.benchmarks.kit import (
    default_json,
    non_negative_float,
    percentile,
    positive_float,
    positive_int,
    report,
)
from mavjet.contract.natsconn import NatsOptions, open_client
from mavjet.contract.subjects import SHADOW_BUCKET, shadow_key
from mavjet.drivers.mavlink.link import LinkConfig
from mavjet.drivers.mavlink.transport import Endpoint
from mavjet.gateway.config import GatewayConfig, VehicleConfig
from mavjet.gateway.daemon import Gateway
from mavjet.gateway.runtime import logs
from mavjet.gateway.shadow.config import ShadowConfig
from mavjet.gateway.shadow.service import ShadowService
from mavjet.ops.natsserver import NatsServer
from mavjet.ops.provision import DEFINITIONS_DIR, load_definitions, provision

ENV = "bench"


async def bare_kv(url: str, ops: int) -> dict[str, Any]:
    """The baseline: one put then one get, awaited one at a time."""
    nc = await open_client(url)
    kv = await nc.jetstream().key_value(SHADOW_BUCKET)
    key = shadow_key(ENV, "BASELINE", "desired")
    value = json.dumps({"params": {"RTL_ALT": 1500}}).encode()
    rtts: list[float] = []
    t0 = time.perf_counter()
    for _ in range(ops):
        t = time.perf_counter()
        await kv.put(key, value)
        await kv.get(key)
        rtts.append(time.perf_counter() - t)
    wall = time.perf_counter() - t0
    await nc.close()
    return {
        "ops": 2 * ops, "ops_per_s": round(2 * ops / wall, 1),
        "put_get_rtt_ms_p50": percentile(rtts, 0.5, scale=1000), "put_get_rtt_ms_p99": percentile(rtts, 0.99, scale=1000),
    }


async def run(args: argparse.Namespace, server: NatsServer, state_dir: Path) -> dict[str, Any]:
    from mavjet.sim.fleet import SimConfig, SimFleet

    nc = await open_client(server.url)
    await provision(nc.jetstream(), load_definitions(DEFINITIONS_DIR, env=ENV, replicas=1))
    baseline = await bare_kv(server.url, args.baseline_ops)
    kv = await nc.jetstream().key_value(SHADOW_BUCKET)
    n = args.vehicles
    result: dict[str, Any] = {"vehicles": n, "rounds": args.rounds, "baseline": baseline}
    async with SimFleet(SimConfig(vehicles=n, base_port=0, speedup=1.0)) as fleet:
        cfg = GatewayConfig(
            vehicles=tuple(VehicleConfig(vid=f"VID-{i + 1:04d}", endpoint=Endpoint.parse(ep))
                           for i, ep in enumerate(fleet.endpoints)),
            nats=NatsOptions(servers=(server.url,)), env=ENV, instance="bench", state_dir=state_dir,
            startup_timeout_s=max(10.0, n / 10), link=LinkConfig(),
        )
        gw = Gateway(cfg)
        svc = ShadowService(ShadowConfig(verify_interval_s=3600.0))
        gw.services.append(svc)
        vids = list(gw.twins)
        done: dict[tuple[str, int], float] = {}
        waiting: dict[str, int] = {}
        all_done = anyio.Event()

        async def watch_reported() -> None:
            w: Any = await kv.watch(f"fleet.{ENV}.veh.*.reported")
            while True:
                try:
                    e = await w.updates(timeout=1.0)
                except nats.errors.TimeoutError:
                    continue
                if e is None or not e.value:
                    continue
                t = time.perf_counter()
                vid = e.key.split(".")[3]
                try:
                    doc = json.loads(e.value)
                except ValueError:
                    continue
                rev = waiting.get(vid)
                if rev is not None and doc.get("desired_revision") == rev and doc.get("converged"):
                    done[(vid, rev)] = t
                    del waiting[vid]
                    if not waiting:
                        all_done.set()

        latencies: list[float] = []
        timeouts = 0

        async def measure() -> None:
            nonlocal all_done, timeouts
            with anyio.fail_after(60 + n):
                await gw.ready.wait()
                await svc.started.wait()
            await anyio.sleep(args.warmup)
            ops0 = svc.store.ops if svc.store else 0
            client_ops = 0
            t_start = time.perf_counter()
            for r in range(args.rounds):
                all_done = anyio.Event()
                written: dict[str, tuple[int, float]] = {}
                value = json.dumps({"params": {"RTL_ALT": 1000 + 10 * (r % 50) + 10}}).encode()

                async def write(vid: str, value: bytes = value, written: dict[str, tuple[int, float]] = written) -> None:
                    t = time.perf_counter()
                    rev = int(await kv.put(shadow_key(ENV, vid, "desired"), value))
                    written[vid] = (rev, t)
                    waiting[vid] = rev

                async with anyio.create_task_group() as tg:
                    for vid in vids:
                        tg.start_soon(write, vid)
                client_ops += len(vids)
                with anyio.move_on_after(args.round_timeout):
                    if waiting:
                        await all_done.wait()
                for vid, (rev, t) in written.items():
                    if (vid, rev) in done:
                        latencies.append(done[(vid, rev)] - t)
                    else:
                        timeouts += 1
                waiting.clear()
            wall = time.perf_counter() - t_start
            gw_ops = (svc.store.ops if svc.store else 0) - ops0
            result.update({
                "converged": len(latencies), "timeouts": timeouts, "duration_s": round(wall, 2),
                "converge_ms_p50": percentile(latencies, 0.5, scale=1000), "converge_ms_p99": percentile(latencies, 0.99, scale=1000),
                "converge_ms_max": percentile(latencies, 1.0, scale=1000),
                "kv_ops": gw_ops + client_ops, "kv_ops_per_s": round((gw_ops + client_ops) / wall, 1),
                "gateway_kv_ops_per_convergence": round(gw_ops / max(1, len(latencies)), 2),
                "reported_conflicts": sum(rc.writer.conflicts for rc in svc.reconcilers.values()),
            })
            gw.request_stop("bench done")

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch_reported)
            tg.start_soon(measure)
            await gw.run()
            tg.cancel_scope.cancel()
    await nc.close()
    p50, base50 = result.get("converge_ms_p50"), baseline["put_get_rtt_ms_p50"]
    if p50 is not None and base50:
        result["ratio_converge_p50_to_kv_rtt_p50"] = round(p50 / base50, 1)
    return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mavjet bench shadow",
                                description="desired write -> reported.converged across N simulated vehicles")
    p.add_argument("--vehicles", type=positive_int, default=10, help="simulated vehicles (default %(default)s)")
    p.add_argument("--rounds", type=positive_int, default=20, help="params changes per vehicle")
    p.add_argument("--warmup", type=non_negative_float, default=2.0, help="seconds after startup before the first round")
    p.add_argument("--round-timeout", type=positive_float, default=30.0, help="give up on a round after this long")
    p.add_argument("--baseline-ops", type=positive_int, default=1000, help="bare KV put+get round trips")
    p.add_argument("--json", type=Path, default=None, help="write results here "
                   "(default: benchmarks/results/shadow-N-STAMP.json in a checkout, docs/benchmarks.md)")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    logs.configure("warning")
    with tempfile.TemporaryDirectory(prefix="mavjet-bench-shadow-") as tmp:
        server = NatsServer(store_dir=f"{tmp}/js")
        server.start()
        try:
            res = anyio.run(run, args, server, Path(tmp) / "state", backend="asyncio")
        finally:
            server.cleanup()
    report(res, args.json or default_json(f"shadow-{args.vehicles}"), width=36)
    return 0 if res.get("timeouts", 1) == 0 else 1
