"""Which vehicles have events on the way, so that a command result may skip the spool without overtaking them.

Sans-IO bookkeeping for `Publisher.publish_event_now` (docs/commands.md,
"Handing the result over"). An event is *on the way* from the moment it is
handed to the publisher until the spool drain has written it to the NATS
connection; the connection keeps what is written in order, so a result
published after that point lands behind it in the stream.

The count per vehicle may be too high (an entry the spool dropped over its
bound is never sent, so it stays counted), never too low. It is reset when
nothing can be on the way: the spool empty, nothing queued for it and no
write to it under way. Until the spool has been seen empty once, what an
earlier run left in it is unknown: `known` is False and nothing may skip it.
"""

from __future__ import annotations

from collections.abc import Iterable

from mavjet.gateway.publish.spool import classify


class EventsOnTheWay:
    __slots__ = ("_by_vid", "known")

    def __init__(self) -> None:
        self._by_vid: dict[str, int] = {}
        self.known = False

    def handed(self, subject: str) -> None:
        """An event was handed over (queued for the spool)."""
        vid = classify(subject)[1]
        self._by_vid[vid] = self._by_vid.get(vid, 0) + 1

    def sent(self, subjects: Iterable[str]) -> None:
        """The drain wrote these spooled events to the connection."""
        for subject in subjects:
            vid = classify(subject)[1]
            n = self._by_vid.get(vid, 0)
            if n > 1:
                self._by_vid[vid] = n - 1
            elif n:
                del self._by_vid[vid]

    def settle(self, *, spool_empty: bool, queue_empty: bool) -> None:
        """Resynchronise: `spool_empty` (open, empty, no write under way); `queue_empty` (nothing queued for it)."""
        if spool_empty:
            self.known = True  # nothing left by an earlier run
            if queue_empty:  # everything handed over has been sent, or dropped
                self._by_vid.clear()

    def clear(self, subject: str) -> bool:
        """Whether an event on `subject` may go out now without overtaking one of its vehicle's."""
        return self.known and not self._by_vid.get(classify(subject)[1])

    def __len__(self) -> int:
        return sum(self._by_vid.values())
