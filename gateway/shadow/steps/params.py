"""`params`: each parameter read back, compared with the vehicle's type in mind, set and verified."""

from __future__ import annotations

from mavjet.drivers.mavlink.params import ParamMismatch, ParamTimeout, values_equal
from mavjet.gateway.shadow.diff import LiveConfig
from mavjet.gateway.shadow.document import Desired, check_param
from mavjet.gateway.shadow.steps.base import Finding, StepContext, Verdict, fmt_number


def observe_param(path: str, name: str, want: float, got: tuple[float, int] | None) -> Finding:
    """One parameter: desired value vs live (value, MAV_PARAM_TYPE); None = not read yet."""
    if got is None:
        return Finding(path=path, verdict=Verdict.UNKNOWN, desired=fmt_number(want), key=name)
    value, ptype = got
    why = check_param(name, want, ptype)
    if why is not None:
        return Finding(path=path, verdict=Verdict.HOLD, desired=fmt_number(want), reported=fmt_number(value),
                       reason=why, key=name)
    verdict = Verdict.OK if values_equal(want, value, ptype) else Verdict.ACT
    return Finding(path=path, verdict=verdict, desired=fmt_number(want), reported=fmt_number(value), key=name)


async def known_param(ctx: StepContext, name: str, path: str, want: float) -> bool:
    """Read `name` into `ctx.live` unless known; False (and noted under `path`) when it cannot be known now."""
    live = ctx.live
    if name in live.params:
        return True
    if name in live.unreadable_params and not ctx.book.due(path):
        ctx.book.waiting(path, fmt_number(want), None)
        return False
    try:
        pv = await ctx.vehicle.read_param(name)
    except ParamTimeout:
        live.unreadable_params.add(name)
        ctx.fail(path, fmt_number(want), None, check_param(name, want, None) or "unknown parameter")
        return False
    live.unreadable_params.discard(name)
    live.params[name] = (pv.value, pv.param_type)
    return True


def on_param_value(d: Desired, live: LiveConfig, name: str, value: float, param_type: int) -> Finding | None:
    """A PARAM_VALUE heard outside a pass (a ground station or RC changed it): update `live`.

    Returns the finding when `name` is shadowed and now differs from desired
    (the caller wakes the reconciler), else None. Pure.
    """
    want = d.params.get(name)
    path = f"params.{name}"
    if want is None or path in d.errors:
        return None
    live.params[name] = (value, param_type)
    live.unreadable_params.discard(name)
    f = observe_param(path, name, want, live.params[name])
    return None if f.verdict is Verdict.OK else f


class ParamsStep:
    field = "params"

    def observe(self, d: Desired, live: LiveConfig) -> list[Finding]:
        out = []
        for name, want in d.params.items():
            path = f"params.{name}"
            if path not in d.errors:
                out.append(observe_param(path, name, want, live.params.get(name)))
        return out

    async def apply(self, ctx: StepContext) -> None:
        d, live, book = ctx.desired, ctx.live, ctx.book
        for seen in self.observe(d, live):
            f, name, want = seen, seen.key, d.params[seen.key]
            if f.verdict is Verdict.UNKNOWN:
                if not await known_param(ctx, name, f.path, want):
                    continue
                f = observe_param(f.path, name, want, live.params.get(name))
            if f.verdict is Verdict.OK:
                book.ok(f.path)
                continue
            if f.verdict is Verdict.HOLD:
                book.note(f.path, f.desired, f.reported, f.reason)
                continue
            if not book.due(f.path):
                book.waiting(f.path, f.desired, f.reported)
                continue
            ptype = live.params[name][1]
            try:
                value = (await ctx.vehicle.set_param(name, want, param_type=ptype)).value
            except ParamMismatch as exc:
                live.params[name] = (exc.reported, ptype)
                ctx.fail(f.path, f.desired, fmt_number(exc.reported),
                         f"the vehicle kept {exc.reported:g} after {exc.attempts} PARAM_SETs (rejected or clamped)")
                continue
            except ParamTimeout as exc:
                live.params.pop(name, None)
                ctx.fail(f.path, f.desired, f.reported, f"no PARAM_VALUE after {exc.attempts} PARAM_SETs")
                continue
            live.params[name] = (value, ptype)
            after = observe_param(f.path, name, want, live.params[name])
            if after.verdict is Verdict.OK:
                book.ok(f.path)
            else:
                ctx.fail(f.path, f.desired, after.reported, f"the vehicle reports {value:g}")
