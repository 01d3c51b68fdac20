"""`geofence`: FENCE items (by digest) and the FENCE_* parameters they imply, applied together."""

from __future__ import annotations

from typing import Any

from mavjet.contract.errors import LinkError, MavjetError
from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.drivers.mavlink.mission import FENCE
from mavjet.drivers.mavlink.params import values_equal
from mavjet.drivers.mavlink.plan import digest
from mavjet.gateway.shadow.diff import LiveConfig
from mavjet.gateway.shadow.document import Desired
from mavjet.gateway.shadow.fence import fence_to_json
from mavjet.gateway.shadow.steps.base import Finding, StepContext, Verdict, fmt_number
from mavjet.gateway.shadow.steps.params import known_param

_REPORTED_PARAMS = ("FENCE_ENABLE", "FENCE_TYPE", "FENCE_ACTION", "FENCE_ALT_MAX")


def reported_fence(live: LiveConfig) -> dict[str, Any] | None:
    """What the vehicle holds, in the desired document's shape (None: not read yet)."""
    if live.fence_items is None:
        return None
    params = {n: live.params[n][0] for n in _REPORTED_PARAMS if n in live.params}
    return fence_to_json(live.fence_items, params)


class GeofenceStep:
    field = "geofence"

    def observe(self, d: Desired, live: LiveConfig) -> list[Finding]:
        g = d.geofence
        if g is None or any(p.startswith("geofence") for p in d.errors):
            return []
        want_params = g.params()
        if live.fence_items is None or any(n not in live.params for n in want_params):
            return [Finding(path="geofence", verdict=Verdict.UNKNOWN, desired=g.digest)]
        off: list[str] = []
        for name, want in want_params.items():
            value, ptype = live.params[name]
            if not values_equal(want, value, ptype):
                off.append(f"{name}={fmt_number(value)} (want {fmt_number(want)})")
        if live.fence_digest != g.digest:
            off.insert(0, f"zones digest {str(live.fence_digest)[:12]} (want {g.digest[:12]})")
        return [Finding(path="geofence", verdict=Verdict.ACT if off else Verdict.OK, desired=g.digest,
                        reported=reported_fence(live), reason="; ".join(off))]

    async def apply(self, ctx: StepContext) -> None:
        d, live, book = ctx.desired, ctx.live, ctx.book
        found = self.observe(d, live)
        if not found or d.geofence is None:
            return
        g, path = d.geofence, "geofence"
        want_params = g.params()
        f = found[0]
        if f.verdict is Verdict.UNKNOWN:
            if live.fence_items is None:
                try:
                    live.fence_items = await ctx.vehicle.download_mission(FENCE)
                except LinkError:
                    raise
                except MavjetError as exc:
                    ctx.fail(path, g.digest, None, f"fence download failed: {exc}")
                    return
                live.fence_digest = digest(live.fence_items)
            for name, want in want_params.items():
                if not await known_param(ctx, name, path, want):
                    return
            f = self.observe(d, live)[0]
        if f.verdict is Verdict.OK:
            book.ok(path)
            return
        if not book.due(path):
            book.waiting(path, g.digest, f.reported)
            return
        try:
            got_digest = await ctx.vehicle.apply_geofence(g)
        except LinkError:
            raise
        except MavjetError as exc:
            live.fence_items = None
            for name in want_params:
                live.params.pop(name, None)
            ctx.fail(path, g.digest, f.reported, f"geofence not applied ({f.reason}): {exc}")
            return
        live.fence_items = list(g.items())
        live.fence_digest = got_digest
        for name, want in want_params.items():
            ptype = live.params.get(name, (0.0, mavlink2.MAV_PARAM_TYPE_REAL32))[1]
            live.params[name] = (want, ptype)
        book.ok(path)
