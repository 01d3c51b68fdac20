"""Objects of which each event loop has one: the fleet's epoll (reactor.py), the links' timer (chores.py)."""

from __future__ import annotations

import asyncio
from typing import ClassVar, Self, cast


class PerLoop:
    """A base for one object per event loop: `for_loop(loop)` finds or makes it, `forget()` lets it go.

    Keyed by the loop's id with the loop kept beside it, not by a weak
    reference to the loop: a closed loop's id can come back for a new loop,
    and the identity check tells the two apart. Each subclass has its own map.
    """

    _by_loop: ClassVar[dict[int, PerLoop]]

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        cls._by_loop = {}

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop this object belongs to."""
        return self._loop

    @classmethod
    def for_loop(cls, loop: asyncio.AbstractEventLoop) -> Self:
        found = cls.existing(loop)
        if found is None:
            found = cls(loop)
            cls._by_loop[id(loop)] = found
        return found

    @classmethod
    def existing(cls, loop: asyncio.AbstractEventLoop) -> Self | None:
        """The loop's object if it has one now (never makes one): not a closed loop's whose id came back."""
        found = cls._by_loop.get(id(loop))
        return cast(Self, found) if found is not None and found.loop is loop else None

    def forget(self) -> None:
        """The loop's next `for_loop` makes a new one (this one is done: its last link or job is gone)."""
        if self._by_loop.get(id(self._loop)) is self:
            del self._by_loop[id(self._loop)]
