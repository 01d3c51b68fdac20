"""Status text rules, pure: repeats collapsed per window, "Reached command #N" paired with MISSION_ITEM_REACHED.

Used by the telemetry model (gateway/twin/telemetry.py), which turns the decisions
into events; docs/events.md (Status text) is the contract.

Repeats: the first line of a (severity, text) pair opens a window and is an
event at once; the same pair inside the window is only counted. When the
window ends with repeats, one summary carries their count and the next
window starts; a window without repeats forgets the pair. Windows end when
`due()` is called (the twin's link tick), or when the pair comes again.

Reached: ArduPilot sends "Reached command #N" and, one telemetry slot later,
MISSION_ITEM_REACHED N. The message wins: once one was seen the text is
ignored; before that the text stands in for it, and the message for the same
N that follows closely is the same fact.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

SEVERITY_NAMES = ("emergency", "alert", "critical", "error", "warning", "notice", "info", "debug")
# ArduPilot repeats a failing PreArm line every 3-6 s: one event per window
# instead of one per line in the 90-day stream.
REPEAT_WINDOW_NS = 30_000_000_000
# A flood of distinct lines: windows beyond this are closed early (bounded memory).
_PAIRS_MAX = 512
_REACHED = re.compile(r"Reached command #(\d+)")
REACHED_PREFIX = "Reached command #"
# The text and the message for one item arrive within a telemetry slot; further apart they are two reaches.
_REACHED_PAIR_NS = 5_000_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Summary:
    """The repeats of one pair in one window: `count` lines, the newest at `time_ns`."""

    severity: int
    text: str
    count: int
    time_ns: int


def text_data(severity: int, text: str, count: int) -> dict[str, object]:
    name = SEVERITY_NAMES[severity] if 0 <= severity < len(SEVERITY_NAMES) else "unknown"
    return {"severity": severity, "severity_name": name, "text": text, "count": count}


@dataclass(slots=True)
class _Window:
    until_ns: int
    count: int = 0  # repeats in this window
    last_ns: int = 0  # the newest repeat


@dataclass(slots=True)
class RepeatCollapser:
    window_ns: int = REPEAT_WINDOW_NS
    _open: dict[tuple[int, str], _Window] = field(default_factory=dict)

    @property
    def pending(self) -> bool:
        """True while a window is open (`due()` has work)."""
        return bool(self._open)

    def offer(self, severity: int, text: str, t_ns: int, out: list[Summary]) -> bool:
        """One line at `t_ns`: True when it is a repeat (counted, no event). Ended windows' summaries go to `out`."""
        key = (severity, text)
        win = self._open.get(key)
        if win is not None and self._close(key, win, t_ns, out):
            win.count += 1
            win.last_ns = t_ns
            return True
        if len(self._open) >= _PAIRS_MAX:
            out.extend(self.due(t_ns, flush=True))
        self._open[key] = _Window(until_ns=t_ns + self.window_ns)
        return False

    def due(self, now_ns: int, *, flush: bool = False) -> list[Summary]:
        """Summaries of the windows ended by `now_ns` (of every open window with `flush`, which forgets them all)."""
        out: list[Summary] = []
        for key, win in list(self._open.items()):
            if not flush:
                self._close(key, win, now_ns, out)
                continue
            if win.count:
                out.append(Summary(severity=key[0], text=key[1], count=win.count, time_ns=win.last_ns))
            del self._open[key]
        return out

    def _close(self, key: tuple[int, str], win: _Window, now_ns: int, out: list[Summary]) -> bool:
        """End the windows of `key` over at `now_ns`; False when the pair is forgotten."""
        while win.until_ns <= now_ns:
            if not win.count:
                del self._open[key]
                return False
            out.append(Summary(severity=key[0], text=key[1], count=win.count, time_ns=win.last_ns))
            win.count = 0
            win.until_ns += self.window_ns
        return True


@dataclass(slots=True)
class ReachedPairing:
    _message_seen: bool = False  # the vehicle sends MISSION_ITEM_REACHED: the text is redundant
    _from_text: tuple[int, int] | None = None  # (seq, time) announced from a text

    def text(self, text: str, t_ns: int) -> int | None:
        """A "Reached command #N" line: the seq to announce, or None."""
        if self._message_seen:
            return None
        match = _REACHED.match(text)
        if match is None:
            return None
        seq = int(match.group(1))
        self._from_text = (seq, t_ns)
        return seq

    def message(self, seq: int, t_ns: int) -> bool:
        """MISSION_ITEM_REACHED: True when it is to be announced (not already, from its text)."""
        self._message_seen = True
        pending, self._from_text = self._from_text, None
        return pending is None or pending[0] != seq or t_ns - pending[1] >= _REACHED_PAIR_NS
