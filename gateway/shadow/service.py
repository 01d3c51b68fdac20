"""The shadow as a gateway extension: one reconciler per vehicle the gateway serves.

Added to `Gateway.extensions`; the daemon starts `run(gateway)` inside its
intake task group once the links are started and cancels it on shutdown.
NATS may be unreachable at start: each reconciler keeps working from the
vehicle side and its KV calls wait for (and survive) the connection.
"""

from __future__ import annotations

from typing import Any

import anyio

from drivers.mavlink.runner import DEFAULT_CONFIG, ProtocolConfig
from gateway.shadow.config import ShadowConfig
from gateway.shadow.kvstore import ShadowStore
from gateway.shadow.reconciler import VehicleReconciler


class ShadowService:
    def __init__(self, cfg: ShadowConfig | None = None, *, protocols: ProtocolConfig = DEFAULT_CONFIG) -> None:
        self.cfg = cfg or ShadowConfig()
        self.protocols = protocols
        self.reconcilers: dict[str, VehicleReconciler] = {}
        self.store: ShadowStore | None = None
        self.started = anyio.Event()

    async def run(self, gateway: Any) -> None:
        if not self.cfg.enabled:
            return
        self.store = ShadowStore(gateway.publisher)
        for vid, twin in gateway.twins.items():
            self.reconcilers[vid] = VehicleReconciler(twin, self.store, self.cfg, protocols=self.protocols)
        async with anyio.create_task_group() as tg:
            for vid, rec in self.reconcilers.items():
                tg.start_soon(rec.run, name=f"vehicle[{vid}].shadow")
            self.started.set()
