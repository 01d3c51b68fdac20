"""The `jetstream` data source against a real nats-server holding a published audit history."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from typing import Any

import pytest

from mavjet.contract.envelope import HEADERS, pack
from mavjet.contract.natsconn import open_client
from mavjet.ops.natsserver import NatsServer
from mavjet.ops.provision import DEFINITIONS_DIR, load_definitions, provision
from tests.analytics.support import History, read


def test_reads_every_event_once(spark: Any, history: History) -> None:
    df = read(spark, history.url, partitions=3)
    assert df.rdd.getNumPartitions() == 3
    rows = df.select("seq", "type", "error", "vid").collect()
    assert len(rows) == history.truth.events == history.published
    assert sorted(r["seq"] for r in rows) == list(range(1, history.published + 1))
    assert all(r["error"] is None for r in rows)
    by_type: dict[str, int] = {}
    for r in rows:
        by_type[r["type"]] = by_type.get(r["type"], 0) + 1
    assert by_type == dict(history.truth.by_type)
    assert {r["vid"] for r in rows} == {f"VID-{i:04d}" for i in range(1, 13)}


def test_partition_count_does_not_change_the_result(spark: Any, history: History) -> None:
    one = read(spark, history.url, partitions=1).select("seq", "time", "alt_m").orderBy("seq").collect()
    many = read(spark, history.url, partitions=7).select("seq", "time", "alt_m").orderBy("seq").collect()
    assert one == many and len(one) == history.published


def test_sequence_range_and_subject_filter(spark: Any, history: History) -> None:
    df = read(spark, history.url, start_seq=100, end_seq=199, partitions=2)
    seqs = sorted(r["seq"] for r in df.select("seq").collect())
    assert seqs == list(range(100, 200))
    failsafes = read(spark, history.url, subjects="fleet.test.veh.*.evt.failsafe", partitions=4)
    got = failsafes.select("type", "failsafe_type").collect()
    assert len(got) == len(history.truth.failsafes) > 0
    assert {r["type"] for r in got} == {"failsafe"}
    two = read(
        spark, history.url, subjects="fleet.test.veh.VID-0001.evt.armed,fleet.test.veh.VID-0002.evt.armed"
    ).collect()
    assert len(two) == history.truth.flights_by_vid["VID-0001"] + history.truth.flights_by_vid["VID-0002"]


def test_time_range_uses_event_time(spark: Any, history: History) -> None:
    start_ns = history.cfg.start_ns + 86_400 * 10**9
    end_ns = start_ns + 86_400 * 10**9
    start = dt.datetime.fromtimestamp(start_ns / 1e9, dt.UTC)
    end = dt.datetime.fromtimestamp(end_ns / 1e9, dt.UTC)
    df = read(spark, history.url, start_time=start.isoformat(), end_time=end.isoformat())
    armed = df.where("type = 'armed'").count()
    expected = sum(1 for f in history.truth.flights if start_ns <= f.start_ns < end_ns)
    assert armed == expected > 0
    times = [r["time"] for r in df.select("time").collect()]
    naive_start, naive_end = start.replace(tzinfo=None), end.replace(tzinfo=None)
    assert times and all(naive_start <= t < naive_end for t in times)


def test_empty_ranges_read_nothing(spark: Any, history: History) -> None:
    assert read(spark, history.url, start_seq=history.published + 1).count() == 0
    assert read(spark, history.url, subjects="fleet.nope.veh.*.evt.>").count() == 0
    assert read(spark, history.url, start_time="2001-01-01T00:00:00Z", end_time="2001-01-02T00:00:00Z").count() == 0


async def _publish_raw(url: str, items: list[tuple[str, bytes]]) -> None:
    nc = await open_client(url)
    js = nc.jetstream()
    await provision(js, load_definitions(DEFINITIONS_DIR, env="raw", replicas=1))
    for i, (subject, payload) in enumerate(items):
        await js.publish(subject, payload, headers={**HEADERS, "Nats-Msg-Id": f"raw-{i}"})
    await nc.close()


def test_undecodable_messages_become_error_rows(spark: Any, nats_server: NatsServer) -> None:
    t_ns = 1_749_945_600 * 10**9
    asyncio.run(
        _publish_raw(
            nats_server.url,
            [
                ("fleet.raw.veh.VID-1.evt.armed", pack("VID-1", t_ns, {"mode": "GUIDED"})),
                ("fleet.raw.veh.VID-1.evt.armed", b"\xc1 not msgpack"),
                ("fleet.raw.veh.VID-2.evt.takeoff", pack("VID-2", t_ns + 1, {"alt_m": 2.5})),
            ],
        )
    )
    rows = read(spark, nats_server.url).orderBy("seq").collect()
    assert [r["seq"] for r in rows] == [1, 2, 3]
    assert rows[0]["error"] is None and rows[0]["mode"] == "GUIDED"
    assert rows[1]["error"] and rows[1]["vid"] == "VID-1" and rows[1]["time"] is None
    assert rows[2]["alt_m"] == 2.5 and rows[2]["type"] == "takeoff"


def test_unreachable_server_fails_with_a_clear_error(spark: Any) -> None:
    from mavjet.ops.natsserver import free_port

    df = read(spark, f"nats://127.0.0.1:{free_port()}", timeout="3s")
    with pytest.raises(Exception, match="cannot connect"):
        df.count()


def test_streaming_reader_picks_up_new_events(spark: Any, nats_server: NatsServer, tmp_path: Any) -> None:
    t_ns = 1_749_945_600 * 10**9
    first = [(f"fleet.raw.veh.VID-{i % 3}.evt.armed", pack(f"VID-{i % 3}", t_ns + i, {"alt_m": float(i)})) for i in range(50)]
    asyncio.run(_publish_raw(nats_server.url, first))
    stream_df = (
        spark.readStream.format("jetstream").option("url", nats_server.url).option("max_events_per_trigger", "20").load()
    )
    counts = stream_df.groupBy("vid").count()
    query = (
        counts.writeStream.outputMode("complete")
        .format("memory")
        .queryName("jetstream_counts")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(90)
        got = {r["vid"]: r["count"] for r in spark.sql("select * from jetstream_counts").collect()}
        assert got == {"VID-0": 17, "VID-1": 17, "VID-2": 16}
        progress = query.recentProgress
        assert len([p for p in progress if p["numInputRows"] > 0]) >= 3  # 50 rows at 20 a trigger
    finally:
        query.stop()

    # the checkpoint remembers the offset: a second run reads only what is new
    more = [("fleet.raw.veh.VID-9.evt.armed", pack("VID-9", t_ns + 100 + i, {})) for i in range(5)]
    asyncio.run(_publish_raw_more(nats_server.url, more))
    seen: list[int] = []
    q2 = (
        stream_df.writeStream.foreachBatch(lambda b, _id: seen.extend(r["seq"] for r in b.select("seq").collect()))
        .option("checkpointLocation", str(tmp_path / "ckpt2"))
        .trigger(availableNow=True)
        .start()
    )
    assert q2.awaitTermination(90)
    assert sorted(seen) == list(range(1, 56))
    deadline = time.monotonic() + 5
    while q2.isActive and time.monotonic() < deadline:
        time.sleep(0.1)


async def _publish_raw_more(url: str, items: list[tuple[str, bytes]]) -> None:
    nc = await open_client(url)
    js = nc.jetstream()
    for i, (subject, payload) in enumerate(items):
        await js.publish(subject, payload, headers={**HEADERS, "Nats-Msg-Id": f"more-{i}"})
    await nc.close()
