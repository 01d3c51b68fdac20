"""`mission`: the vehicle's mission compared by digest; the plan fetched from TWIN_BLOBS, uploaded, verified.

A plan with terrain-frame items is uploaded only when the vehicle reports
terrain data for each (mavjet.drivers.mavlink.terrain), else the field fails naming the item.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from mavjet.contract.errors import LinkError, MavjetError
from mavjet.contract.events import EventType
from mavjet.contract.subjects import BLOBS_BUCKET
from mavjet.drivers.mavlink.mission import MISSION
from mavjet.drivers.mavlink.plan import Plan, PlanError, digest
from mavjet.drivers.mavlink.terrain import terrain_points, terrain_refusals
from mavjet.gateway.shadow.diff import LiveConfig
from mavjet.gateway.shadow.document import Desired, MissionSpec
from mavjet.gateway.shadow.steps.base import Finding, StepContext, Verdict
from mavjet.gateway.stores.chunks import BlobError, BlobFailure

PlanSource = Callable[[str], Awaitable[Plan]]  # object name -> plan; raises BlobError or PlanError


def check_plan(spec: MissionSpec, plan: Plan) -> str | None:
    """Why this plan is not the mission desired names (None when it is)."""
    if spec.matches(plan.mission_digest):
        return None
    return f"{spec.object} has mission digest {plan.mission_digest[:16]}, desired says {spec.digest[:16]}"


class MissionStep:
    field = "mission"

    def __init__(self, plans: PlanSource) -> None:
        self.plans = plans

    def observe(self, d: Desired, live: LiveConfig) -> list[Finding]:
        spec = d.mission
        if spec is None or "mission" in d.errors:
            return []
        if live.mission_digest is None:
            return [Finding(path="mission", verdict=Verdict.UNKNOWN, desired=spec.digest)]
        verdict = Verdict.OK if spec.matches(live.mission_digest) else Verdict.ACT
        return [Finding(path="mission", verdict=verdict, desired=spec.digest, reported=live.mission_digest)]

    async def apply(self, ctx: StepContext) -> None:
        d, live, book = ctx.desired, ctx.live, ctx.book
        found = self.observe(d, live)
        if not found or d.mission is None:
            return
        spec, path = d.mission, "mission"
        f = found[0]
        if f.verdict is Verdict.UNKNOWN:
            try:
                items = await ctx.vehicle.download_mission(MISSION)
            except LinkError:
                raise
            except MavjetError as exc:
                ctx.fail(path, spec.digest, None, f"mission download failed: {exc}")
                return
            live.mission_digest = digest(items)
            live.mission_count = len(items)
            f = self.observe(d, live)[0]
        if f.verdict is Verdict.OK:
            book.ok(path)
            return
        if not book.due(path):
            book.waiting(path, spec.digest, live.mission_digest)
            return
        try:
            plan = await self.plans(spec.object)
        except BlobError as exc:
            if exc.kind is BlobFailure.NOT_CONNECTED:
                book.note(path, spec.digest, live.mission_digest, "NATS not connected: cannot fetch the mission")
            else:
                ctx.fail(path, spec.digest, live.mission_digest,
                         f"cannot read {spec.object!r} from {BLOBS_BUCKET}: {exc.error} {exc.detail}".strip())
            return
        except PlanError as exc:
            ctx.fail(path, spec.digest, live.mission_digest, f"{spec.object}: {exc}")
            return
        why = check_plan(spec, plan)
        if why is not None:
            ctx.fail(path, spec.digest, live.mission_digest, why)
            return
        points = terrain_points(plan.mission)
        if points:  # the vehicle alone can say whether it holds terrain data there
            refused = terrain_refusals(plan.mission, await ctx.vehicle.terrain_reports(points))
            if refused:
                ctx.fail(path, spec.digest, live.mission_digest, f"{spec.object}: {'; '.join(refused)}")
                return
        try:
            got = await ctx.vehicle.upload_and_verify(plan.mission, MISSION)
        except LinkError:
            raise
        except MavjetError as exc:
            live.mission_digest = None  # unknown after a failed transfer: read it back next time
            ctx.fail(path, spec.digest, None, f"mission upload failed: {exc}")
            return
        live.mission_digest = got
        live.mission_count = len(plan.mission)
        ctx.emit(EventType.MISSION_UPLOADED, object=spec.object, digest=got, count=len(plan.mission))
        book.ok(path)
