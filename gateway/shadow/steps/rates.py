"""`rates`: stream rates read with GET_MESSAGE_INTERVAL, set with SET_MESSAGE_INTERVAL, read back."""

from __future__ import annotations

from mavjet.contract.errors import CommandRejected, CommandTimeout
from mavjet.gateway.shadow.diff import LiveConfig
from mavjet.gateway.shadow.document import Desired
from mavjet.gateway.shadow.fence import rate_matches, rate_message
from mavjet.gateway.shadow.steps.base import Finding, StepContext, Verdict, command_reason


def observe_rate(path: str, channel: str, hz: float, live: LiveConfig) -> Finding:
    if rate_message(channel) is None:
        return Finding(path=path, verdict=Verdict.HOLD, desired=hz, key=channel,
                       reason=f"{channel} is not a MAVLink message this gateway knows")
    current = live.rates_hz.get(channel)
    if current is None:
        return Finding(path=path, verdict=Verdict.UNKNOWN, desired=hz, key=channel)
    verdict = Verdict.OK if rate_matches(hz, current) else Verdict.ACT
    return Finding(path=path, verdict=verdict, desired=hz, reported=current, key=channel)


class RatesStep:
    field = "rates"

    def __init__(self, *, request_timeout_s: float) -> None:
        self.request_timeout_s = request_timeout_s  # how long a MESSAGE_INTERVAL answer is waited for

    def observe(self, d: Desired, live: LiveConfig) -> list[Finding]:
        out = []
        for ch, hz in d.rates.items():
            path = f"rates.{ch}"
            if path not in d.errors:
                out.append(observe_rate(path, ch, hz, live))
        return out

    async def apply(self, ctx: StepContext) -> None:
        d, live, book = ctx.desired, ctx.live, ctx.book
        for seen in self.observe(d, live):
            f, ch, hz = seen, seen.key, d.rates[seen.key]
            if f.verdict is Verdict.HOLD:
                book.note(f.path, f.desired, f.reported, f.reason)
                continue
            rm = rate_message(ch)
            assert rm is not None  # observe() holds unknown messages
            name, msg_id = rm
            if f.verdict is Verdict.UNKNOWN:
                got = await ctx.vehicle.read_message_rate(msg_id, wait_s=self.request_timeout_s)
                if got is not None:
                    live.rates_hz[ch] = round(got, 3)
                    f = observe_rate(f.path, ch, hz, live)
            # still UNKNOWN: the autopilot does not answer GET_MESSAGE_INTERVAL; set it like a differing rate
            if f.verdict is Verdict.OK:
                book.ok(f.path)
                continue
            if not book.due(f.path):
                book.waiting(f.path, hz, f.reported)
                continue
            try:
                await ctx.vehicle.set_message_rate(msg_id, hz)
            except (CommandRejected, CommandTimeout) as exc:
                ctx.fail(f.path, hz, f.reported, f"SET_MESSAGE_INTERVAL for {name}: {command_reason(exc)}")
                continue
            got = await ctx.vehicle.read_message_rate(msg_id, wait_s=self.request_timeout_s)
            if got is None:
                # No GET_MESSAGE_INTERVAL on this autopilot: the accepted SET is the best evidence.
                live.rates_hz[ch] = hz
                book.ok(f.path)
                continue
            live.rates_hz[ch] = round(got, 3)
            if observe_rate(f.path, ch, hz, live).verdict is Verdict.OK:
                book.ok(f.path)
            else:
                ctx.fail(f.path, hz, round(got, 3), f"{name} interval reads back as {got:g} Hz")
