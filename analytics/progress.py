"""How `mavjet replay` reports its stages while it runs (stderr lines; silent in tests and benchmarks)."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TextIO


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
    """One line per stage on a text stream (stderr): when it starts and what it took,
    and (`tick`) how far a long stage has come.

    Lines, not a redrawn bar: they survive a log file or a pipe.
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.current = ""
        self._since = time.monotonic()

    def stage(self, name: str) -> None:
        self.current, self._since = name, time.monotonic()
        print(f"mavjet replay: {name} ...", file=self.stream, flush=True)

    def done(self, name: str, seconds: float, detail: str = "") -> None:
        tail = f": {detail}" if detail else ""
        print(f"mavjet replay: {name} done in {seconds:.1f} s{tail}", file=self.stream, flush=True)

    def tick(self, text: str) -> None:
        elapsed = time.monotonic() - self._since
        print(f"mavjet replay: {self.current or 'working'}: {elapsed:.0f} s, {text}", file=self.stream, flush=True)


def running_tasks(spark: Any) -> str | None:
    """'done/total tasks' over the stages Spark is running now; None when none is."""
    tracker = spark.sparkContext.statusTracker()
    done = total = 0
    for stage_id in tracker.getActiveStageIds():
        info = tracker.getStageInfo(stage_id)
        if info is not None:
            done, total = done + info.numCompletedTasks, total + info.numTasks
    return f"{done}/{total} tasks of the running Spark stages" if total else None


class SparkTicker:
    """While the block runs, report `running_tasks` every `every_s` seconds.

    Reading 1M events takes most of a minute in one stage: without this the
    replay says nothing between "reading" and "read done". A daemon thread
    polls Spark's status tracker (py4j serves each Python thread on its own
    connection); nothing is printed while no stage runs.
    """

    def __init__(self, spark: Any, emit: Callable[[str], None], *, every_s: float = 10.0) -> None:
        self.spark = spark
        self.emit = emit
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mavjet-replay-progress", daemon=True)

    def __enter__(self) -> SparkTicker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                line = running_tasks(self.spark)
            except Exception:  # the session is stopping: progress is best effort
                return
            if line is not None and not self._stop.is_set():
                self.emit(line)
