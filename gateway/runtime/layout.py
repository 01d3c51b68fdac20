"""The state dir's worker layout: a change of `--workers N` must not strand events or commands.

A vehicle's unsent events (the spool), unsent track samples and its command
ledger live in the state dir of the process that serves it: `state_dir`
itself with one process, `state_dir/worker-I` with `--workers N`
(gateway/runtime/workers.py). Change N and a vehicle may belong to another worker,
which would neither send the old spool's events nor know the old ledger's
commands, so a command redelivered by TWIN_CMD could run a second time.

So the layout is recorded in `state_dir/workers.json`, and a start with a
different N is refused (exit 2, one line) while any state dir of the old
layout still holds spooled events or track samples, a command in flight, or a
command recorded within TWIN_CMD's redelivery horizon (its `max_age`, 5
minutes: after that the stream holds no copy that could come back). A clean
stop followed by a few minutes' wait, or a start with the old N until it
drains, makes the change safe.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

from mavjet.contract.errors import ConfigError
from mavjet.gateway.commands.consumer import LEDGER_FILE
from mavjet.gateway.commands.ledger import IN_FLIGHT, outcome_log_path, read_outcome_log
from mavjet.gateway.stores.recorder import TRACKS_SPOOL

LAYOUT_FILE = "workers.json"
SPOOL_FILE = "spool.sqlite"
REDELIVERY_HORIZON_S = 300.0  # TWIN_CMD max_age (deploy/jetstream/twin_cmd.json)


def state_dirs(state_dir: Path, workers: int) -> list[Path]:
    """Where the processes of an N-worker layout keep their state."""
    return [state_dir] if workers <= 1 else [state_dir / f"worker-{i}" for i in range(workers)]


def _count(db_path: Path, sql: str, params: tuple[object, ...] = ()) -> int:
    if not db_path.is_file():
        return 0
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=5.0)
    try:
        return int(db.execute(sql, params).fetchone()[0])
    except sqlite3.OperationalError:  # no such table yet: nothing stored
        return 0
    finally:
        db.close()


def unfinished(d: Path, *, now_ns: int) -> str | None:
    """Why the state in `d` must stay with its process, or None."""
    for name, what in ((SPOOL_FILE, "unsent events"), (TRACKS_SPOOL, "unsent track samples")):
        if n := _count(d / name, "SELECT count(*) FROM spool"):
            return f"{n} {what}"
    ledger = d / LEDGER_FILE
    since_ns = now_ns - int(REDELIVERY_HORIZON_S * 1e9)
    recent = _count(ledger, "SELECT count(*) FROM ledger WHERE result = ? OR at_ns >= ?", (IN_FLIGHT, since_ns))
    log_path = outcome_log_path(ledger)
    if log_path.is_file():
        recent += sum(1 for e in read_outcome_log(log_path) if e.in_flight or e.at_ns >= since_ns)
    if recent:
        return f"{recent} command(s) in flight or recorded in the last {REDELIVERY_HORIZON_S / 60:g} minutes"
    return None


def check_layout(state_dir: Path, workers: int, *, now_ns: int | None = None) -> None:
    """Record `workers` as the state dir's layout; raise ConfigError if the previous one still holds work."""
    path = state_dir / LAYOUT_FILE
    try:
        old = int(json.loads(path.read_text())["workers"])
    except FileNotFoundError:
        old = None
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError("state_dir", f"{path} is not a workers layout ({exc}); remove it after a clean stop") from None
    if old is not None and old != workers:
        now = time.time_ns() if now_ns is None else now_ns
        for d in state_dirs(state_dir, old):
            why = unfinished(d, now_ns=now)
            if why is not None:
                raise ConfigError(
                    "workers", f"{state_dir} was last run with --workers {old} and {d} still holds {why}: start with "
                    f"--workers {old} until it drains (a clean stop, then {REDELIVERY_HORIZON_S / 60:g} minutes)")
    if old != workers:
        state_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"workers": workers}) + "\n")
        os.replace(tmp, path)  # atomic: a crash leaves the old layout or the new one
