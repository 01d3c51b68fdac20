"""`KeepAlives`: one task sends every held command's in_progress, on time, and holding costs no task."""

from __future__ import annotations

import gc
from collections.abc import Awaitable, Callable

import anyio
import anyio.lowlevel
import pytest

from mavjet.contract.errors import LinkError
from mavjet.gateway.commands.keepalive import KeepAlives


def _counter(calls: list[str], name: str) -> Callable[[], Awaitable[None]]:
    async def in_progress() -> None:
        calls.append(name)
    return in_progress


async def test_a_long_command_is_kept_alive_and_a_short_one_is_not() -> None:
    ka = KeepAlives(every_s=0.1)
    calls: list[str] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(ka.run)

        async def short() -> None:
            with ka.holding(_counter(calls, "short")):
                await anyio.sleep(0.03)

        async def long() -> None:
            with ka.holding(_counter(calls, "long")):
                await anyio.sleep(0.35)

        tg.start_soon(short)
        await long()
        assert len(ka) == 0
        await anyio.sleep(0.25)  # nothing held: nothing more is sent
        tg.cancel_scope.cancel()
    assert calls.count("short") == 0, calls
    assert 2 <= calls.count("long") <= 4, calls
    assert ka.sent == len(calls)


async def test_overlapping_commands_each_get_their_own_keepalives_in_due_order() -> None:
    ka = KeepAlives(every_s=0.1)
    calls: list[str] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(ka.run)

        async def hold(name: str, start_s: float, for_s: float) -> None:
            await anyio.sleep(start_s)
            with ka.holding(_counter(calls, name)):
                await anyio.sleep(for_s)

        async with anyio.create_task_group() as inner:
            inner.start_soon(hold, "a", 0.0, 0.45)
            inner.start_soon(hold, "b", 0.05, 0.2)
        tg.cancel_scope.cancel()
    assert 3 <= calls.count("a") <= 5, calls
    assert 1 <= calls.count("b") <= 2, calls
    assert calls[0] == "a" and calls[1] == "b", calls  # a is due first, then b


async def test_the_work_exception_comes_out_as_itself() -> None:
    ka = KeepAlives(every_s=5.0)
    with pytest.raises(LinkError), ka.holding(_counter([], "x")):
        raise LinkError("tcp:127.0.0.1:5760", "closed")
    assert len(ka) == 0


async def test_holding_a_command_leaves_no_cyclic_garbage() -> None:
    # A keep-alive task per command, cancelled at its end, left ~35 objects for the cyclic collector.
    ka = KeepAlives(every_s=5.0)
    calls: list[str] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(ka.run)
        gc.collect()
        gc.disable()
        try:
            for _ in range(50):
                with ka.holding(_counter(calls, "c")):
                    await anyio.lowlevel.checkpoint()
            found = gc.collect()
        finally:
            gc.enable()
        tg.cancel_scope.cancel()
    assert found < 50, f"{found} cyclic objects after 50 commands"


def test_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="every_s"):
        KeepAlives(every_s=0)
