"""The shadow as a gateway service: one reconciler per vehicle the gateway serves.

The daemon starts `run(ctx)` inside its intake task group once the links are
started and cancels it on shutdown. NATS may be unreachable at start: each
reconciler keeps working from the vehicle side and its KV calls wait for
(and survive) the connection.
"""

from __future__ import annotations

import anyio
from anyio.abc import TaskStatus

from mavjet.gateway.services import ServiceContext
from mavjet.gateway.shadow.config import ShadowConfig
from mavjet.gateway.shadow.kvstore import ShadowStore
from mavjet.gateway.shadow.reconciler import VehicleReconciler


class ShadowService:
    def __init__(self, cfg: ShadowConfig | None = None) -> None:
        self.cfg = cfg or ShadowConfig()
        # MAVLink timeouts and retries are not configured here: the shadow acts through each
        # vehicle's session, which carries GatewayConfig.protocols (`[commands]`), one source.
        self.reconcilers: dict[str, VehicleReconciler] = {}
        self.store: ShadowStore | None = None
        self.started = anyio.Event()

    async def run(self, ctx: ServiceContext, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        if not self.cfg.enabled:
            task_status.started()
            return
        self.store = ShadowStore(ctx.nats)
        for vid, vehicle in ctx.vehicles.items():
            self.reconcilers[vid] = VehicleReconciler(vehicle, self.store, self.cfg, gateway=ctx.cfg, nats=ctx.nats,
                                                      metrics=ctx.metrics)
        async with anyio.create_task_group() as tg:
            for vid, rec in self.reconcilers.items():
                tg.start_soon(self._while_owner, ctx, vid, rec, name=f"vehicle[{vid}].shadow")
            self.started.set()
            task_status.started()

    @staticmethod
    async def _while_owner(ctx: ServiceContext, vid: str, rec: VehicleReconciler) -> None:
        """Reconcile (and write `reported`) only while this gateway owns the vehicle (docs/ownership.md)."""
        ownership = ctx.ownership
        while True:
            await ownership.wait_until(vid, owner=True)
            rec.became_owner()
            async with anyio.create_task_group() as tg:
                tg.start_soon(rec.run, name=f"vehicle[{vid}].shadow.reconcile")
                await ownership.wait_until(vid, owner=False)
                tg.cancel_scope.cancel()
