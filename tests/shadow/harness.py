"""Shadow test harness: real nats-server + real sim vehicles + an in-process gateway running the shadow service."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.kv import KeyValue

from mavjet.contract.subjects import SHADOW_BUCKET, shadow_key
from mavjet.gateway.daemon import Gateway
from mavjet.gateway.shadow.config import ShadowConfig
from mavjet.gateway.shadow.service import ShadowService
from mavjet.sim.fleet import SimFleet
from tests.support import ENV, gateway_config, wait_for_async

FAST = ShadowConfig(verify_interval_s=3.0, retry_initial_s=0.3, retry_max_s=2.0, resync_interval_s=2.0, tick_s=0.2, confirm_s=3.0,
                    request_timeout_s=1.0)


@dataclass
class Shadowed:
    """What a shadow test holds: the sim fleet, the gateway, its shadow service, a KV handle."""

    fleet: SimFleet
    gw: Gateway
    shadow: ShadowService
    nc: Client
    kv: KeyValue

    def key(self, vid: str, doc: str) -> str:
        return shadow_key(ENV, vid, doc)

    async def set_desired(self, vid: str, doc: Any) -> int:
        data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        deadline = time.monotonic() + 15
        while True:  # right after a server restart JetStream may need a moment
            try:
                return int(await self.kv.put(self.key(vid, "desired"), data))
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError, nats.js.errors.ServiceUnavailableError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)

    async def get(self, vid: str, doc: str) -> tuple[int, dict[str, Any] | None]:
        try:
            e = await self.kv.get(self.key(vid, doc))
        except Exception:
            return 0, None
        return int(e.revision or 0), json.loads(e.value or b"null")

    async def reported(self, vid: str) -> dict[str, Any] | None:
        return (await self.get(vid, "reported"))[1]

    async def wait_converged(self, vid: str, revision: int, timeout_s: float = 30.0) -> dict[str, Any]:
        async def check() -> dict[str, Any] | None:
            rep = await self.reported(vid)
            if rep and rep.get("desired_revision") == revision and rep.get("converged"):
                return rep
            return None

        result: dict[str, Any] = await wait_for_async(check, timeout_s)
        return result

    async def wait_reported(self, vid: str, pred: Callable[[dict[str, Any]], Any], timeout_s: float = 30.0) -> dict[str, Any]:
        async def check() -> dict[str, Any] | None:
            rep = await self.reported(vid)
            return rep if rep and pred(rep) else None

        result: dict[str, Any] = await wait_for_async(check, timeout_s)
        return result


@asynccontextmanager
async def shadowed(nc: Client, url: str, fleet: SimFleet, state_dir: Path,
                   cfg: ShadowConfig = FAST) -> AsyncIterator[Shadowed]:
    gw = Gateway(gateway_config(url, fleet.endpoints, state_dir))
    svc = ShadowService(cfg)
    gw.services.append(svc)
    kv = await nc.jetstream().key_value(SHADOW_BUCKET)
    # A plain task, not a task group: pytest-asyncio may set a fixture up and
    # tear it down in different tasks, which a cancel scope does not allow.
    task = asyncio.create_task(gw.run())
    try:
        with anyio.fail_after(30):
            await gw.ready.wait()
            await svc.started.wait()
        yield Shadowed(fleet=fleet, gw=gw, shadow=svc, nc=nc, kv=kv)
    finally:
        gw.request_stop("test done")
        with anyio.move_on_after(15):
            await asyncio.shield(task)
        if not task.done():
            task.cancel()
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
