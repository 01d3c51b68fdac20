"""`PullOne`: a vehicle's next command from its pull consumer, idle requests ended by the server (real nats-server)."""

from __future__ import annotations

import gc
import time

import anyio
import pytest
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import APIError

from mavjet.contract.natsadapter import PullInternals
from mavjet.gateway.commands.pull import CONFLICT_PAUSE_S, PullOne

STREAM, SUBJECT, DURABLE = "PULLTEST", "pulltest.cmd.>", "gw_pull"


async def _bound(nc: Client) -> object:
    js = nc.jetstream()
    await js.add_stream(name=STREAM, subjects=[SUBJECT])
    await js.add_consumer(STREAM, ConsumerConfig(durable_name=DURABLE, ack_policy=AckPolicy.EXPLICIT,
                                                 max_ack_pending=1))
    return await js.pull_subscribe_bind(durable=DURABLE, stream=STREAM)


async def test_nats_py_still_has_what_pull_one_reads(nc: Client) -> None:
    assert PullInternals.present(await _bound(nc)), "nats-py changed: PullOne fell back to fetch (slower, same results)"


async def test_an_idle_request_is_ended_by_the_server_without_cyclic_garbage(nc: Client) -> None:
    pull = PullOne(await _bound(nc))
    assert pull.fast
    gc.collect()
    gc.disable()
    try:
        t0 = time.monotonic()
        for _ in range(10):
            assert await pull.next(0.05) is None
            assert pull.answered, "the server's 408 ended the request, not the local deadline"
        took_s = time.monotonic() - t0
        garbage = gc.collect()
    finally:
        gc.enable()
    assert took_s < 10 * (0.05 + 1.0), "each idle request ended near its expiry, not at the grace deadline"
    # nats-py's fetch(1, timeout) leaves ~28 objects of cyclic garbage per idle request (the module docstring).
    assert garbage < 10 * 5, f"{garbage} objects of cyclic garbage for 10 idle requests"


async def test_a_command_published_while_waiting_is_returned_and_acked(nc: Client) -> None:
    pull = PullOne(await _bound(nc))
    js = nc.jetstream()
    got: list[bytes] = []

    async def wait() -> None:
        msg = await pull.next(5.0)
        assert msg is not None
        got.append(msg.data)
        await msg.ack_sync()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.sleep(0.1)  # the request is open at the server
            await js.publish("pulltest.cmd.arm", b"one")
    assert got == [b"one"]
    info = await js.consumer_info(STREAM, DURABLE)
    assert info.num_ack_pending == 0 and info.num_pending == 0


async def test_commands_come_in_order_one_at_a_time(nc: Client) -> None:
    pull = PullOne(await _bound(nc))
    js = nc.jetstream()
    for i in range(3):
        await js.publish("pulltest.cmd.x", str(i).encode())
    seen = []
    with anyio.fail_after(10):
        for _ in range(3):
            msg = await pull.next(2.0)
            assert msg is not None
            seen.append(msg.data)
            await msg.ack_sync()
        assert await pull.next(0.05) is None
    assert seen == [b"0", b"1", b"2"]


async def test_without_the_internals_it_falls_back_to_fetch(nc: Client) -> None:
    psub = await _bound(nc)
    pull = PullOne(psub)
    pull.fast = False
    await nc.jetstream().publish("pulltest.cmd.y", b"fallback")
    with anyio.fail_after(10):
        msg = await pull.next(2.0)
        assert msg is not None and msg.data == b"fallback"
        await msg.ack_sync()
        assert await pull.next(0.05) is None


async def test_a_request_nobody_serves_is_an_api_error(nc: Client) -> None:
    psub = await _bound(nc)
    psub._nms = "nobody.listens.here"  # type: ignore[attr-defined]
    with anyio.fail_after(10), pytest.raises(APIError):
        await PullOne(psub).next(0.05)  # 503 no responders: the loop's error path re-binds after a backoff


async def test_a_request_the_server_never_ends_is_reported_unanswered(nc: Client) -> None:
    psub = await _bound(nc)
    pull = PullOne(psub)
    # The request reaches a subscriber that never answers, as one to a consumer the server lost track of.
    await nc.subscribe("silent.consumer")
    psub._nms = "silent.consumer"  # type: ignore[attr-defined]
    with anyio.fail_after(10):
        assert await pull.next(0.05) is None
    assert not pull.answered


async def test_a_refused_request_pauses_instead_of_spinning(nc: Client) -> None:
    """A 409 (here: MaxWaiting 1, a second request while one waits) comes back at once; the loop must not spin."""
    js = nc.jetstream()
    await js.add_stream(name=STREAM, subjects=[SUBJECT])
    await js.add_consumer(STREAM, ConsumerConfig(durable_name=DURABLE, ack_policy=AckPolicy.EXPLICIT,
                                                 max_ack_pending=1, max_waiting=1))
    first = PullOne(await js.pull_subscribe_bind(durable=DURABLE, stream=STREAM))
    second = PullOne(await js.pull_subscribe_bind(durable=DURABLE, stream=STREAM))
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(first.next, 2.0)  # holds the one waiting slot
            await anyio.sleep(0.2)
            t0 = time.monotonic()
            for _ in range(3):
                assert await second.next(2.0) is None
            took_s = time.monotonic() - t0
            tg.cancel_scope.cancel()
    assert second.conflicts == 3 and second.answered
    assert took_s >= 3 * CONFLICT_PAUSE_S, "each refusal paused"
    assert took_s < 2.0, "refused at once, not left to expire"
