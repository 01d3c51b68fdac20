"""How the operator CLI draws for people: rich tables, live views and progress bars on a terminal.

Only on a terminal. When stdout is a pipe or a file the commands print the
plain, stable text they always printed (scripts and tests read it), and
`--json` never goes through here. Progress goes to stderr: a rich bar when
stderr is a terminal, one plain line per tenth otherwise (a log file or a
serial console reads those fine).

`MAVJET_PLAIN=1` (or `NO_COLOR`/`TERM=dumb`, which rich honours for colour)
forces the plain output on a terminal too.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from typing import IO, Protocol

from rich import box
from rich.console import Console
from rich.live import Live
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table
from rich.text import Text

PLAIN_ENV = "MAVJET_PLAIN"


def is_tty(stream: IO[str] | None = None) -> bool:
    """True when `stream` (default stdout) is a terminal and plain output was not asked for."""
    s = sys.stdout if stream is None else stream
    if os.environ.get(PLAIN_ENV, "") not in ("", "0"):
        return False
    try:
        return s.isatty()
    except (AttributeError, ValueError):  # a closed or fake stream is not a terminal
        return False


def console(stream: IO[str] | None = None) -> Console:
    return Console(file=sys.stdout if stream is None else stream, highlight=False)


def rich_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], *, title: str | None = None,
    right: Sequence[str] = (),
) -> Table:
    """A table of already formatted cells; columns named in `right` are right-aligned (numbers)."""
    t = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", header_style="bold")
    for h in headers:
        t.add_column(h, justify="right" if h in right else "left", overflow="fold")
    for r in rows:
        t.add_row(*r)
    return t


def print_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], *, title: str | None = None,
    right: Sequence[str] = (), stream: IO[str] | None = None,
) -> None:
    console(stream).print(rich_table(headers, rows, title=title, right=right))


def plain_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to the widest cell, two spaces apart: the stable piped form of a table."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in (list(headers), *rows)]
    return "\n".join(lines)


class ProgressFn(Protocol):
    """The callback long transfers call: bytes done so far and the total (0 if unknown)."""

    def __call__(self, done_bytes: int, total_bytes: int) -> None: ...


class LineProgress:
    """Plain progress lines on stderr, one per tenth."""

    def __init__(self, label: str, *, quiet: bool = False, stream: IO[str] | None = None) -> None:
        self.label = label
        self.quiet = quiet
        self.stream = stream
        self.shown = -1

    def __call__(self, done_bytes: int, total_bytes: int) -> None:
        tenth = 10 if total_bytes == 0 else min(10, done_bytes * 10 // total_bytes)
        if self.quiet or tenth == self.shown:
            return
        self.shown = tenth
        print(f"{self.label}: {done_bytes}/{total_bytes} bytes ({tenth * 10}%)",
              file=self.stream or sys.stderr, flush=True)


class BarProgress:
    """A rich progress bar (bytes, speed, time left) driven by the same callback."""

    def __init__(self, progress: Progress, task: TaskID) -> None:
        self.progress = progress
        self.task = task

    def __call__(self, done_bytes: int, total_bytes: int) -> None:
        self.progress.update(self.task, completed=done_bytes, total=total_bytes or None)


def transfer_bar(stream: IO[str]) -> Progress:
    """The rich bar of a transfer (label, bar, bytes, speed, time left), cleared from the screen when it stops."""
    return Progress(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        TimeRemainingColumn(), console=Console(file=stream), transient=True,
    )


@contextlib.contextmanager
def transfer_progress(label: str, *, quiet: bool = False, stream: IO[str] | None = None) -> Iterator[ProgressFn]:
    """`with transfer_progress("get x") as progress: ... progress(done, total)`.

    A bar on a terminal, plain lines elsewhere, nothing with `quiet`. The bar
    is cleared from the screen when the block ends; the command's own result
    line says what happened.
    """
    err = sys.stderr if stream is None else stream
    if quiet or not is_tty(err):
        yield LineProgress(label, quiet=quiet, stream=stream)
        return
    bar = transfer_bar(err)
    with bar:
        yield BarProgress(bar, bar.add_task(label, total=None))


@contextlib.contextmanager
def live_screen(stream: IO[str] | None = None) -> Iterator[Live]:
    """A full-screen live view (alternate screen, restored on exit): `live.update(live_text(s))`."""
    with Live(console=console(stream), screen=True, auto_refresh=False, redirect_stdout=False) as live:
        yield live


def live_text(text: str) -> Text:
    return Text(text, no_wrap=True, overflow="crop")
