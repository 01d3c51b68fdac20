"""`mavjet bench shadow-watch --keys 1000 --rounds 3`: one shadow watch vs one per key.

On a fresh nats-server with TWIN_SHADOW provisioned and a `desired` value
written for each of N vehicles, each round runs, interleaved in the same
process and server:

- `shared`: the gateway's multi-filter watch (`SharedDesired`, one consumer);
- `per_key`: N per-key watches (`watch_key`, one consumer each: the design
  before issue 50, and still what a one-vehicle gateway runs);

and measures the time from starting them until every key's current value has
been delivered, the time until the server has every consumer (for per-key,
`watch_key` delivers its first value by a direct get before the consumer
exists, so both are reported) and the server's consumer count on
KV_TWIN_SHADOW. Between runs the consumers are deleted. Medians over the
rounds. (Server RSS is left out: Go keeps freed memory, so in an interleaved
run it says more about the previous run than this one; `mavjet bench
consumers` measures memory per consumer on fresh servers.)
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import anyio
from nats.aio.client import Client

from mavjet.benchmarks.kit import default_json, positive_int, report
from mavjet.contract.natsconn import open_client
from mavjet.contract.subjects import SHADOW_BUCKET, SHADOW_STREAM, shadow_key
from mavjet.gateway.shadow.kvstore import DesiredEntry, ShadowStore, watch_key
from mavjet.gateway.shadow.watch import SharedDesired
from mavjet.ops.natsserver import NatsServer
from mavjet.ops.provision import DEFINITIONS_DIR, load_definitions, provision

ENV = "bench"


class _Access:
    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.js = nc.jetstream(timeout=10.0)
        self.connected = anyio.Event()
        self.connected.set()


async def _consumers(nc: Client) -> int:
    return int((await nc.jetstream().stream_info(SHADOW_STREAM)).state.consumer_count)


async def _clear(nc: Client, n: int) -> None:
    """Delete every consumer (a listing is paged, 256 a page: bounded passes)."""
    js = nc.jetstream()
    for _ in range(n // 256 + 5):
        infos = await js.consumers_info(SHADOW_STREAM)
        if not infos:
            return
        for info in infos:
            await js.delete_consumer(SHADOW_STREAM, info.name)
    raise RuntimeError("consumers left on KV_TWIN_SHADOW")


async def _run(kind: str, *, url: str, admin: Client, keys: list[str], timeout_s: float) -> dict[str, Any]:
    nc = await open_client(url, connect_timeout=5)
    store = ShadowStore(_Access(nc))  # type: ignore[arg-type]
    first: dict[str, float] = {}
    n = len(keys)
    all_in = anyio.Event()

    def seen(key: str) -> None:
        first.setdefault(key, time.perf_counter())
        if len(first) == n:
            all_in.set()

    try:
        async with anyio.create_task_group() as tg:
            t0 = time.perf_counter()
            if kind == "shared":
                watch = SharedDesired(store, keys, resync_interval_s=60.0)
                tg.start_soon(watch.run)
                for k in keys:
                    def heard(e: DesiredEntry, k: str = k) -> None:
                        seen(k)
                    tg.start_soon(watch.follow, k, heard)
            else:
                for k in keys:
                    def heard_k(e: DesiredEntry, k: str = k) -> None:
                        seen(k)
                    tg.start_soon(partial(watch_key, store, k, heard_k, resync_interval_s=60.0))
            with anyio.fail_after(timeout_s):
                await all_in.wait()
                delivered_s = max(first.values()) - t0
                want = 1 if kind == "shared" else n
                for _ in range(int(timeout_s / 0.02)):  # bounded: fail_after stops it first
                    if await _consumers(admin) >= want:
                        break
                    await anyio.sleep(0.02)
                consumers_s = time.perf_counter() - t0
            count = await _consumers(admin)
            tg.cancel_scope.cancel()
    finally:
        await nc.close()
    await _clear(admin, n)
    return {"delivered_s": round(delivered_s, 3), "consumers_s": round(consumers_s, 3), "consumers": count}


async def bench(n: int, rounds: int, timeout_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="mavjet-bench-watch-") as tmp:
        srv = NatsServer(store_dir=str(Path(tmp) / "js"))
        srv.start()
        try:
            admin = await open_client(srv.url, connect_timeout=5)
            await provision(admin.jetstream(), load_definitions(DEFINITIONS_DIR, env=ENV, replicas=1))
            kv = await admin.jetstream().key_value(SHADOW_BUCKET)
            if n >= 1000:
                # The provisioned bucket has the server's default cap of 1,000 consumers, so per-key
                # watches for more than 1,000 vehicles fail ("maximum consumers limit reached"):
                # raised here so the old design can be measured at all.
                info = await admin.jetstream().stream_info(SHADOW_STREAM)
                await admin.jetstream().update_stream(replace(info.config, max_consumers=4 * n))
            keys = [shadow_key(ENV, f"V{i:05d}", "desired") for i in range(n)]
            for k in keys:
                await kv.put(k, b'{"params":{"RTL_ALT":2000}}')
            runs: dict[str, list[dict[str, Any]]] = {"shared": [], "per_key": []}
            for r in range(rounds):
                for kind in (("shared", "per_key") if r % 2 == 0 else ("per_key", "shared")):
                    runs[kind].append(await _run(kind, url=srv.url, admin=admin, keys=keys, timeout_s=timeout_s))
                    print(f"round {r + 1} {kind}: {runs[kind][-1]}", flush=True)
            await admin.close()
        finally:
            srv.stop()
    result: dict[str, Any] = {"benchmark": "shadow-watch", "keys": n, "rounds": rounds}
    for kind, rs in runs.items():
        for fig in ("delivered_s", "consumers_s", "consumers"):
            result[f"{kind}_{fig}_median"] = statistics.median(x[fig] for x in rs)
    result["runs"] = runs
    return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mavjet bench shadow-watch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=positive_int, default=1000, help="vehicles' desired keys (default %(default)s)")
    p.add_argument("--rounds", type=positive_int, default=3, help="interleaved rounds (default %(default)s)")
    p.add_argument("--timeout", type=float, default=120.0, help="per run, seconds (default %(default)s)")
    p.add_argument("--json", type=Path, default=None, help="write results here "
                   "(default: benchmarks/results/shadow-watch-KEYS-STAMP.json in a checkout)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = asyncio.run(bench(args.keys, args.rounds, args.timeout))
    report(result, args.json or default_json(f"shadow-watch-{args.keys}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
