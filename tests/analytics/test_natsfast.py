"""The range reader's short cut through nats-py (`natsadapter.install_ordered_short_cut`), against a real nats-server."""

from __future__ import annotations

import asyncio
from typing import Any

from mavjet.analytics.natsread import RangeReader
from mavjet.analytics.options import SourceOptions
from tests.analytics.support import History


def test_short_cut_reads_every_event_in_order_and_leaves_other_traffic_to_nats_py(history: History) -> None:
    async def go() -> tuple[list[int], list[Any], Any]:
        # small batches: the reader stops and resumes often, frames are cut at every buffer boundary
        reader = RangeReader(SourceOptions.from_options({"url": history.url, "batch_rows": "37"}), 1, history.published)
        await reader.open()
        assert reader._nc is not None
        plain: list[Any] = []

        async def cb(msg: Any) -> None:
            plain.append((msg.data, msg.headers))

        # an ordinary subscription on the same connection, with and without headers
        await reader._nc.subscribe("t.plain", cb=cb)
        await reader._nc.publish("t.plain", b"x", headers={"K": "v"})
        await reader._nc.publish("t.plain", b"y")
        await reader._nc.flush()
        seqs: list[int] = []
        async with asyncio.timeout(60):
            while (batch := await reader.next_batch()) is not None:
                seqs.extend(batch[1])
            while len(plain) < 2:
                await asyncio.sleep(0.01)
        parse = reader._nc._ps.parse
        await reader.close()
        return seqs, plain, parse

    seqs, plain, parse = asyncio.run(go())
    assert getattr(parse, "__module__", None) == "mavjet.contract.natsadapter"  # the short cut was in place
    assert seqs == list(range(1, history.published + 1))
    assert plain == [(b"x", {"K": "v"}), (b"y", None)]
