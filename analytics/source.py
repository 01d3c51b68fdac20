"""`spark.read.format("jetstream")`: a Spark 4 Python Data Source over a JetStream stream.

    spark.dataSource.register(JetStreamDataSource)
    df = (spark.read.format("jetstream")
          .option("url", "nats://127.0.0.1:4222")
          .option("subjects", "fleet.prod.veh.*.evt.>")
          .option("start_time", "2025-06-01T00:00:00Z")
          .load())

Batch: the planner resolves the options to an inclusive sequence range and
splits it into partitions (`options.plan_ranges`); each Spark task reads its
range in its own Python worker with its own connection (`natsread.iter_range`)
and yields Arrow record batches, which Spark takes without per-row conversion.

Streaming (`spark.readStream.format("jetstream")`): offsets are
`{"seq": <last stream sequence read>}`; each micro-batch reads the sequences
after the previous offset up to the stream's last, cut into partitions the
same way, so the batch jobs run unchanged on a stream.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from mavjet.analytics import natsread
from mavjet.analytics.columns import SCHEMA_DDL
from mavjet.analytics.options import SourceOptions, plan_ranges

FORMAT = "jetstream"


class SeqRange(InputPartition):  # type: ignore[misc]
    """One partition: stream sequences start..end inclusive, plus the envelope-time cut."""

    def __init__(self, start: int, end: int, time_from_us: int | None, time_to_us: int | None) -> None:
        super().__init__((start, end))
        self.start = start
        self.end = end
        self.time_from_us = time_from_us
        self.time_to_us = time_to_us


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark expects for `schema` (it compares with equals())."""
    from pyspark.sql.pandas.types import to_arrow_schema

    result: pa.Schema = to_arrow_schema(schema, timezone="UTC")
    return result


def _batches(
    opts: SourceOptions, part: SeqRange, schema: StructType
) -> Iterator[pa.RecordBatch]:
    pa_schema = arrow_schema(schema)
    names = list(schema.fieldNames())
    from mavjet.analytics.columns import COLUMN_NAMES

    index = [COLUMN_NAMES.index(n) for n in names]
    for cols in natsread.iter_range(
        opts, part.start, part.end, time_from_us=part.time_from_us, time_to_us=part.time_to_us
    ):
        arrays = [pa.array(cols[i], type=pa_schema.field(j).type) for j, i in enumerate(index)]
        yield pa.RecordBatch.from_arrays(arrays, schema=pa_schema)


class JetStreamReader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema

    def partitions(self) -> Sequence[SeqRange]:
        lo, hi = natsread.run(self.opts)
        ranges = plan_ranges(lo, hi, self.opts.partitions)
        if not ranges:
            # Spark wants at least one partition; an empty range reads nothing.
            return [SeqRange(1, 0, None, None)]
        return [SeqRange(a, b, self.opts.start_time_us, self.opts.end_time_us) for a, b in ranges]

    def read(self, partition: SeqRange) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return _batches(self.opts, partition, self.schema)


class JetStreamStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema
        self.target_seq: int | None = None

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: read up to what is in the stream now, in read-limited batches."""
        self.target_seq = natsread.latest_seq(self.opts)

    def initialOffset(self) -> dict[str, int]:
        if self.opts.starting == "latest" and self.opts.start_seq is None and self.opts.start_time_us is None:
            return {"seq": natsread.latest_seq(self.opts)}
        lo, _ = natsread.run(self.opts)
        return {"seq": lo - 1}

    def getDefaultReadLimit(self) -> Any:
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

        if self.opts.max_events_per_trigger:
            return ReadMaxRows(self.opts.max_events_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, int] | None = None, limit: Any = None) -> dict[str, int]:
        last = natsread.latest_seq(self.opts) if self.target_seq is None else self.target_seq
        if self.opts.end_seq is not None:
            last = min(last, self.opts.end_seq)
        max_rows = getattr(limit, "max_rows", None)
        if start is not None:
            last = max(last, int(start["seq"]))
            if max_rows:
                last = min(last, int(start["seq"]) + int(max_rows))
        return {"seq": last}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[SeqRange]:
        ranges = plan_ranges(int(start["seq"]) + 1, int(end["seq"]), self.opts.partitions)
        return [SeqRange(a, b, self.opts.start_time_us, self.opts.end_time_us) for a, b in ranges]

    def read(self, partition: SeqRange) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return _batches(self.opts, partition, self.schema)

    def commit(self, end: dict[str, int]) -> None:
        return None


class JetStreamDataSource(DataSource):  # type: ignore[misc]
    """Options: url, stream, subjects, start_seq/end_seq, start_time/end_time,
    partitions, creds, batch_rows, lateness, timeout; streaming: starting, max_events_per_trigger."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.opts = SourceOptions.from_options(options)

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> JetStreamReader:
        return JetStreamReader(self.opts, schema)

    def streamReader(self, schema: StructType) -> JetStreamStreamReader:
        return JetStreamStreamReader(self.opts, schema)


def register(spark: Any) -> None:
    spark.dataSource.register(JetStreamDataSource)
