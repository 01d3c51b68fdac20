"""The shadow as a gateway service: one reconciler per vehicle the gateway serves.

The daemon starts `run(ctx)` inside its intake task group once the links are
started and cancels it on shutdown. NATS may be unreachable at start: each
reconciler keeps working from the vehicle side and its KV calls wait for
(and survive) the connection.

`desired` is heard through one watch for the whole gateway when it serves
several vehicles (`watch.SharedDesired`: one consumer on the server instead
of one per vehicle), and through the vehicle's own per-key watch when it
serves one (a companion computer, whose per-vehicle credential allows only
the filtered create: docs/security.md). The shared watch covers every
configured vehicle, owned or not: the keys do not change with ownership, a
standby's watch costs one consumer, and a reconciler that starts when its
gateway becomes the owner is handed the last value the watch saw.
"""

from __future__ import annotations

import anyio
from anyio.abc import TaskStatus

from mavjet.contract.subjects import shadow_key
from mavjet.gateway.services import ServiceContext
from mavjet.gateway.shadow.config import ShadowConfig
from mavjet.gateway.shadow.kvstore import ShadowStore
from mavjet.gateway.shadow.reconciler import VehicleReconciler
from mavjet.gateway.shadow.watch import DesiredSource, KeyDesired, SharedDesired


class ShadowService:
    def __init__(self, cfg: ShadowConfig | None = None) -> None:
        self.cfg = cfg or ShadowConfig()
        # MAVLink timeouts and retries are not configured here: the shadow acts through each
        # vehicle's session, which carries GatewayConfig.protocols (`[commands]`), one source.
        self.reconcilers: dict[str, VehicleReconciler] = {}
        self.store: ShadowStore | None = None
        self.watch: SharedDesired | None = None  # None: one vehicle, watched by key
        self.started = anyio.Event()

    async def run(self, ctx: ServiceContext, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        if not self.cfg.enabled:
            task_status.started()
            return
        self.store = ShadowStore(ctx.nats)
        source: DesiredSource
        if len(ctx.vehicles) > 1:
            keys = [shadow_key(ctx.cfg.env, vid, "desired") for vid in ctx.vehicles]
            self.watch = SharedDesired(self.store, keys, resync_interval_s=self.cfg.resync_interval_s)
            source = self.watch
        else:
            source = KeyDesired(self.store, resync_interval_s=self.cfg.resync_interval_s)
        for vid, vehicle in ctx.vehicles.items():
            self.reconcilers[vid] = VehicleReconciler(vehicle, self.store, self.cfg, gateway=ctx.cfg, nats=ctx.nats,
                                                      metrics=ctx.metrics, source=source)
        async with anyio.create_task_group() as tg:
            if self.watch is not None:
                tg.start_soon(self.watch.run, name="shadow.watch")
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
