"""Durable, bounded, ordered on-disk spool for events and command results.

Every event goes through the spool before it is published, so ordering is one
rule (oldest first) and an outage or a restart loses nothing: SQLite in WAL
mode with synchronous=NORMAL survives process crashes. The file is opened and
used on one worker thread (`mavjet.gateway.publish.sqlite`), never on the event loop.

The bound (`spool_max_events`) protects the companion computer's disk, which
matters more than a week-old statustext, but not every event is a statustext.
Past the bound the spool drops by worth, never by age alone:

- informational events first, then safety events, and a `cmd_result` only
  when the spool holds nothing else (the one result a command owes), oldest
  first;
- informational and safety events from the vehicle holding the most of that
  class first (water-filling), so one flooding vehicle cannot push out the
  others' events; within a vehicle, oldest first.

Dropping never reorders what stays, so each vehicle's events still go out in
the order they happened. An overflow is logged once when it starts and once
when it ends (the spool drained below the bound), with counts per class and
per vehicle; a dropped `cmd_result` is logged every time.
"""

from __future__ import annotations

import heapq
import sqlite3
import time
from collections import Counter, deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import chain, islice
from pathlib import Path

import structlog

from mavjet.contract.events import SPOOL_CLASS, SpoolClass
from mavjet.contract.subjects import parse_subject
from mavjet.gateway.publish.sqlite import SqliteWorker

log = structlog.get_logger("mavjet.spool")


# The one table of priorities, by event type, is the catalogue's (contract/events.py,
# `EventSpec.spool`); every type it does not raise is INFO.
EVENT_CLASS: Mapping[str, SpoolClass] = SPOOL_CLASS

# Over the bound, classes give up their events in this order.
DROP_ORDER = (SpoolClass.INFO, SpoolClass.SAFETY, SpoolClass.CMD_RESULT)

Key = tuple[SpoolClass, str]  # (class, vid)


@lru_cache(maxsize=4096)
def classify(subject: str) -> Key:
    """(class, vid) of `fleet.<env>.veh.<vid>.evt.<type>`; anything else is an informational event of vid ''.

    Cached: a fleet has a few subjects per vehicle and event type.
    """
    try:
        _env, vid, kind, name = parse_subject(subject)
    except ValueError:
        return SpoolClass.INFO, ""
    return (EVENT_CLASS.get(name, SpoolClass.INFO) if kind == "evt" else SpoolClass.INFO), vid


def fair_take(counts: Mapping[str, int], n: int) -> dict[str, int]:
    """How many to take from each vehicle so that `n` go in all, the fullest first (water-filling).

    Every vehicle above a level is cut down to it, and what is still missing is
    taken one each from the vehicles at that level, the busiest (then by vid)
    first. A vehicle below the others' level loses nothing while they have more.
    """
    if n <= 0:
        return {}
    if n >= sum(counts.values()):
        return {k: c for k, c in counts.items() if c > 0}

    def above(level: int) -> int:
        return sum(c - level for c in counts.values() if c > level)

    lo, hi = 0, max(counts.values())  # above(hi) == 0 <= n < above(0)
    while lo < hi:  # the lowest level that takes at most n
        mid = (lo + hi) // 2
        if above(mid) <= n:
            hi = mid
        else:
            lo = mid + 1
    take = {k: c - lo for k, c in counts.items() if c > lo}
    rest = n - sum(take.values())  # < the number of vehicles holding >= lo, since above(lo - 1) > n
    for k in sorted((k for k, c in counts.items() if c >= lo), key=lambda k: (-counts[k], k))[:rest]:
        take[k] = take.get(k, 0) + 1
    return take


def plan_drops(counts: Mapping[Key, int], excess: int) -> tuple[dict[Key, int], int]:
    """What goes so that `excess` entries go: (how many of each (class, vid)'s oldest, how many oldest results).

    Informational, then safety events, each class fairly across vehicles
    (`fair_take`); then, only when nothing else is left, the oldest command
    results whatever their vehicle: a result is never traded for another
    vehicle's, only for a newer one.
    """
    plan: dict[Key, int] = {}
    for cls in DROP_ORDER:
        if excess <= 0:
            break
        if cls is SpoolClass.CMD_RESULT:
            return plan, excess
        take = fair_take({vid: n for (c, vid), n in counts.items() if c is cls}, excess)
        plan.update(((cls, vid), n) for vid, n in take.items())
        excess -= sum(take.values())
    return plan, 0


@dataclass(frozen=True, slots=True)
class Drops:
    """What one append dropped, by (class, vid)."""

    by_key: Mapping[Key, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.by_key.values())

    @property
    def by_class(self) -> dict[str, int]:
        out: Counter[str] = Counter()
        for (cls, _vid), n in self.by_key.items():
            out[cls.value] += n
        return dict(out)

    @property
    def by_vehicle(self) -> dict[str, int]:
        out: Counter[str] = Counter()
        for (_cls, vid), n in self.by_key.items():
            out[vid] += n
        return dict(out)

    def __bool__(self) -> bool:
        return self.total > 0


NO_DROPS = Drops()


@dataclass(slots=True)
class OverflowEpisode:
    """From the first drop until the spool drains below its bound."""

    started_mono: float
    by_class: Counter[str] = field(default_factory=Counter)
    by_vehicle: Counter[str] = field(default_factory=Counter)

    def add(self, drops: Drops) -> None:
        self.by_class.update(drops.by_class)
        self.by_vehicle.update(drops.by_vehicle)


@dataclass(frozen=True, slots=True)
class SpoolEntry:
    rowid: int
    subject: str
    msg_id: str
    payload: bytes


class Spool:
    def __init__(self, path: Path, *, max_entries: int) -> None:
        self.path = path
        self.max_entries = max_entries
        self.dropped = 0
        self.dropped_by_class: Counter[str] = Counter()
        self.depth = 0  # known once the worker has opened the file (`open()` or the first call)
        self.episode: OverflowEpisode | None = None
        self.episodes = 0
        # The row ids held per (class, vid), oldest first, kept on the worker
        # thread: choosing what to drop needs neither a scan of the table nor an
        # index on it (an index on (class, vid) made every write ~3x slower).
        # About 40 bytes an entry: ~4 MB at the default bound.
        self._ids: dict[Key, deque[int]] = {}
        self._db = SqliteWorker(path, name="spool", setup=self._setup)

    def _setup(self, db: sqlite3.Connection) -> None:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute(
            "CREATE TABLE IF NOT EXISTS spool (id INTEGER PRIMARY KEY AUTOINCREMENT, subject TEXT NOT NULL, "
            "msg_id TEXT NOT NULL, payload BLOB NOT NULL)"
        )
        # The class and vehicle come from the subject, so what an earlier run
        # (of any version) left is classified the same way.
        self._ids = {}
        for rowid, subject in db.execute("SELECT id, subject FROM spool ORDER BY id"):
            self._ids.setdefault(classify(str(subject)), deque()).append(int(rowid))
        self.depth = sum(len(q) for q in self._ids.values())

    # -- on the worker thread ------------------------------------------------
    def _append(self, db: sqlite3.Connection, entries: list[tuple[str, str, bytes]]) -> Drops:
        if not entries:
            return NO_DROPS
        db.execute("BEGIN")
        try:
            db.executemany("INSERT INTO spool (subject, msg_id, payload) VALUES (?, ?, ?)", entries)
            # AUTOINCREMENT on the one connection that writes: the batch's ids are consecutive.
            last = int(db.execute("SELECT last_insert_rowid()").fetchone()[0])
            added: dict[Key, list[int]] = {}
            for rowid, (subject, _msg_id, _payload) in zip(range(last - len(entries) + 1, last + 1), entries,
                                                             strict=True):
                added.setdefault(classify(subject), []).append(rowid)
            victims = self._victims(added, self.depth + len(entries) - self.max_entries)
            if victims:
                db.executemany("DELETE FROM spool WHERE id = ?", [(i,) for ids in victims.values() for i in ids])
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        for key, ids in added.items():
            self._ids.setdefault(key, deque()).extend(ids)
        self.depth += len(entries)
        if not victims:
            return NO_DROPS
        for key, ids in victims.items():  # each key's victims are its oldest ids
            q = self._ids[key]
            for _ in ids:
                q.popleft()
        drops = Drops({k: len(ids) for k, ids in victims.items()})
        self._dropped(drops)
        return drops

    def _victims(self, added: Mapping[Key, list[int]], excess: int) -> dict[Key, list[int]]:
        """The ids to drop so that `excess` go, given what is held and what this write adds (newer)."""
        if excess <= 0:
            return {}

        def held(key: Key) -> Iterator[int]:
            return chain(self._ids.get(key, ()), added.get(key, ()))

        def tagged(key: Key) -> Iterator[tuple[int, Key]]:
            return ((i, key) for i in held(key))

        keys = self._ids.keys() | added.keys()
        fair, oldest = plan_drops({k: len(self._ids.get(k, ())) + len(added.get(k, ())) for k in keys}, excess)
        victims = {k: list(islice(held(k), n)) for k, n in fair.items()}
        if oldest:  # nothing but command results left: the oldest, whatever their vehicle
            results = [tagged(k) for k in keys if k[0] is SpoolClass.CMD_RESULT]
            for i, k in islice(heapq.merge(*results), oldest):
                victims.setdefault(k, []).append(i)
        return victims

    def _dropped(self, drops: Drops) -> None:
        self.depth -= drops.total
        self.dropped += drops.total
        self.dropped_by_class.update(drops.by_class)
        if self.episode is None:
            self.episode = OverflowEpisode(time.monotonic())
            self.episodes += 1
            log.error("spool_overflow", bound=self.max_entries, dropped_by_class=drops.by_class,
                      dropped_by_vehicle=drops.by_vehicle,
                      hint="NATS unreachable for long; informational events go first, busiest vehicle first")
        self.episode.add(drops)
        results = {vid: n for (cls, vid), n in drops.by_key.items() if cls is SpoolClass.CMD_RESULT}
        if results:  # the spool holds nothing but command results: each loss is an owed result lost
            log.error("spool_dropped_cmd_results", dropped=sum(results.values()), by_vehicle=results,
                      bound=self.max_entries)

    def _end_episode(self, why: str) -> None:
        ep = self.episode
        if ep is None:
            return
        self.episode = None
        log.warning("spool_overflow_ended", why=why, duration_s=round(time.monotonic() - ep.started_mono, 1),
                    dropped=sum(ep.by_class.values()), dropped_by_class=dict(ep.by_class),
                    dropped_by_vehicle=dict(ep.by_vehicle), depth=self.depth, bound=self.max_entries)

    def _peek(self, db: sqlite3.Connection, limit: int) -> list[SpoolEntry]:
        rows = db.execute("SELECT id, subject, msg_id, payload FROM spool ORDER BY id LIMIT ?", (limit,)).fetchall()
        return [SpoolEntry(int(r[0]), str(r[1]), str(r[2]), bytes(r[3])) for r in rows]

    def _remove_upto(self, db: sqlite3.Connection, rowid: int) -> None:
        db.execute("DELETE FROM spool WHERE id <= ?", (rowid,))
        for key, q in list(self._ids.items()):
            while q and q[0] <= rowid:
                q.popleft()
                self.depth -= 1
            if not q:
                del self._ids[key]
        if self.depth < self.max_entries:
            self._end_episode("drained below the bound")

    # -- blocking (tests, tools) -------------------------------------------------
    def append_sync(self, entries: list[tuple[str, str, bytes]]) -> Drops:
        """Append (subject, msg_id, payload) rows; returns what was dropped to stay within the bound."""
        return self._db.call(self._append, entries)

    def peek_sync(self, limit: int) -> list[SpoolEntry]:
        return self._db.call(self._peek, limit)

    def remove_upto_sync(self, rowid: int) -> None:
        self._db.call(self._remove_upto, rowid)

    @property
    def opened(self) -> bool:
        """The file is open: `depth` counts what it holds (until then it reads 0, whatever is in it)."""
        return self._db.opened

    # -- async API -------------------------------------------------------------
    async def open(self) -> None:
        """Open the file and count what an earlier run left (on the worker thread)."""
        await self._db.open()

    async def append(self, entries: list[tuple[str, str, bytes]]) -> Drops:
        return await self._db.run(self._append, entries)

    async def peek(self, limit: int) -> list[SpoolEntry]:
        return await self._db.run(self._peek, limit)

    async def remove_upto(self, rowid: int) -> None:
        await self._db.run(self._remove_upto, rowid)

    def close(self) -> None:
        if self.episode is not None:  # still over the bound: the summary is due now
            self._db.call(lambda _db: self._end_episode("closed while over the bound"))
        self._db.close()
