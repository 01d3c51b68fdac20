"""How `mavjet replay` reports its stages while it runs (stderr lines; silent in tests and benchmarks)."""

from __future__ import annotations

import sys
from typing import Protocol, TextIO


class Progress(Protocol):
    """Where the replay reports its stages while it runs."""

    def stage(self, name: str) -> None: ...

    def done(self, name: str, seconds: float, detail: str = "") -> None: ...


class QuietProgress:
    def stage(self, name: str) -> None:
        return None

    def done(self, name: str, seconds: float, detail: str = "") -> None:
        return None


class LineProgress:
    """One line per stage on a text stream (stderr): when it starts and what it took.

    Lines, not a redrawn bar: Spark's stages give no fraction done to show,
    and lines survive a log file or a pipe.
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr

    def stage(self, name: str) -> None:
        print(f"mavjet replay: {name} ...", file=self.stream, flush=True)

    def done(self, name: str, seconds: float, detail: str = "") -> None:
        tail = f": {detail}" if detail else ""
        print(f"mavjet replay: {name} done in {seconds:.1f} s{tail}", file=self.stream, flush=True)
