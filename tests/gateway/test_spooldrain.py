"""The one spool drain (gateway/publish/spooldrain.py) against a real nats-server: order, at least once, no duplicates."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.js.api import StreamConfig
from nats.js.errors import NoStreamResponseError

from mavjet.gateway.publish.spool import Spool
from mavjet.gateway.publish.spooldrain import drain_spool

STREAM = "DRAIN_TEST"


@pytest.fixture
async def spool(tmp_path: Path) -> AsyncIterator[Spool]:
    s = Spool(tmp_path / "drain.sqlite", max_entries=100)
    await s.open()
    try:
        yield s
    finally:
        s.close()


async def stored(nc: Client) -> list[tuple[str, bytes]]:
    js = nc.jetstream()
    n = (await js.stream_info(STREAM)).state.messages
    out = []
    for seq in range(1, n + 1):
        m = await js.get_msg(STREAM, seq)
        out.append((m.subject or "", m.data or b""))
    return out


async def test_a_failed_ack_keeps_the_rest_spooled_in_order_and_a_republish_is_dropped(nc: Client,
                                                                                       spool: Spool) -> None:
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=STREAM, subjects=["drain.ok.>"], duplicate_window=120.0))
    rows = [("drain.ok.a", "m1", b"1"), ("drain.ok.a", "m2", b"2"), ("drain.ok.b", "m3", b"3"),
            ("drain.late.c", "m4", b"4"),  # no stream yet: no responders, an error ack
            ("drain.ok.a", "m5", b"5"), ("drain.ok.b", "m6", b"6")]
    await spool.append(rows)
    acked: list[int] = []
    errors: list[Exception] = []

    with pytest.raises(NoStreamResponseError):
        await drain_spool(spool, js, timeout_s=5.0, on_acked=lambda n, _s: acked.append(n), on_error=errors.append)
    assert acked == [3] and len(errors) == 1 and isinstance(errors[0], NoStreamResponseError)
    assert [e.msg_id for e in await spool.peek(10)] == ["m4", "m5", "m6"]  # the failed one and all after it
    assert spool.depth == 3
    # The batch was sent whole: what followed the failure is stored, though not yet known to be.
    assert [d for _s, d in await stored(nc)] == [b"1", b"2", b"3", b"5", b"6"]

    # The stream now takes the late subject: the rest goes out again, in spool order; 5 and 6 are duplicates.
    await js.update_stream(StreamConfig(name=STREAM, subjects=["drain.ok.>", "drain.late.>"], duplicate_window=120.0))
    assert await drain_spool(spool, js, timeout_s=5.0, on_acked=lambda n, _s: acked.append(n)) == 3
    assert acked == [3, 3] and spool.depth == 0
    assert await stored(nc) == [("drain.ok.a", b"1"), ("drain.ok.a", b"2"), ("drain.ok.b", b"3"),
                                ("drain.ok.a", b"5"), ("drain.ok.b", b"6"), ("drain.late.c", b"4")]

    # An entry published again (acked, but its removal lost to a crash) keeps its Nats-Msg-Id: dropped.
    await spool.append(rows[:2])
    assert await drain_spool(spool, js, timeout_s=5.0, on_acked=lambda n, _s: acked.append(n)) == 2
    assert spool.depth == 0 and len(await stored(nc)) == 6  # nothing stored twice


async def test_a_missing_ack_times_out_and_leaves_no_publish_waiting(nc: Client, spool: Spool) -> None:
    """nats-py never times an ack out: the drain does, and cancels what it waited for (or the slots stay taken)."""
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=STREAM, subjects=["drain.ok.>"]))
    silent = await nc.subscribe("drain.silent.>")  # takes the message, never answers: no ack, no 503
    await spool.append([("drain.ok.a", "m1", b"1"), ("drain.silent.x", "m2", b"2"), ("drain.ok.b", "m3", b"3")])
    acked: list[int] = []
    errors: list[Exception] = []
    with pytest.raises(TimeoutError):
        await drain_spool(spool, js, timeout_s=0.5, on_acked=lambda n, _s: acked.append(n), on_error=errors.append)
    assert acked == [1] and len(errors) == 1 and isinstance(errors[0], TimeoutError)
    assert [e.msg_id for e in await spool.peek(10)] == ["m2", "m3"]
    assert js.publish_async_pending() == 0
    await silent.unsubscribe()


async def test_an_empty_spool_publishes_nothing(nc: Client, spool: Spool) -> None:
    acked: list[int] = []
    assert await drain_spool(spool, nc.jetstream(), timeout_s=5.0, on_acked=lambda n, _s: acked.append(n)) == 0
    assert acked == []
