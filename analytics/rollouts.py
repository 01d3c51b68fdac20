"""Fleet rollouts as the audit trail tells them (docs/rollout.md): one row per rollout. Pure DataFrame -> DataFrame.

`mavjet rollout` publishes its fleet-level events on
`fleet.<env>.rollout.<id>.evt.<type>` (the envelope's `vid` is the rollout
id) and one `rollout_vehicle` per vehicle outcome on the vehicle's own
subject. A reader of TWIN_EVENTS with the subjects `fleet.<env>.*.*.evt.>`
(or none: the whole stream) gets both; this job joins them by the `rollout`
key every one of them carries in `data`.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from mavjet.analytics.jobs import _t, valid
from mavjet.contract.events import EventType

# How a rollout ended, by the event that ended it (the newest of them wins: a halt, then a rollback).
OUTCOMES = {
    EventType.ROLLOUT_DONE: "done", EventType.ROLLOUT_HALTED: "halted", EventType.ROLLOUT_ABORTED: "aborted",
    EventType.ROLLOUT_ROLLED_BACK: "rolled_back",
}
# The `failure` values of a rollout_vehicle event (ops/rollout_plan.py's Failure; analytics does not import ops).
FAILURES = ("armed", "link", "timeout", "rejected", "invalid", "conflict")


def _data(key: str) -> Column:
    return F.get_json_object("data", f"$.{key}")


def rollouts(events: DataFrame) -> DataFrame:
    """One row per rollout: rollout, started, ended, outcome (`running` while none of OUTCOMES is stored),
    targets, waves, waves_done, max_failures, change (JSON), converged, failed, rolled_back, one
    `failed_<kind>` count per FAILURES, and duration_s (started -> ended).

    Vehicle counts are distinct vehicles by their last outcome event, so a
    vehicle converged and later rolled back counts once in each.
    """
    ev = valid(events).where(F.col("type").startswith("rollout_")).withColumn(
        "rollout", F.coalesce(_data("rollout"), F.col("vid")))
    is_outcome = F.col("type").isin(*[t.value for t in OUTCOMES])
    outcome = F.create_map(*[x for t, o in OUTCOMES.items() for x in (F.lit(t.value), F.lit(o))])
    fleet = ev.where(~_t(EventType.ROLLOUT_VEHICLE)).groupBy("rollout").agg(
        F.min(F.when(_t(EventType.ROLLOUT_STARTED), F.col("time"))).alias("started"),
        F.max(F.when(is_outcome, F.col("time"))).alias("ended"),
        F.max_by(F.when(is_outcome, outcome[F.col("type")]), F.when(is_outcome, F.col("time"))).alias("outcome"),
        F.first(F.when(_t(EventType.ROLLOUT_STARTED), _data("targets").cast("int")), ignorenulls=True).alias("targets"),
        F.first(F.when(_t(EventType.ROLLOUT_STARTED), F.size(F.from_json(_data("waves"), "array<int>"))),
                ignorenulls=True).alias("waves"),
        F.first(F.when(_t(EventType.ROLLOUT_STARTED), _data("max_failures").cast("int")),
                ignorenulls=True).alias("max_failures"),
        F.first(F.when(_t(EventType.ROLLOUT_STARTED), _data("change")), ignorenulls=True).alias("change"),
        F.countDistinct(F.when(_t(EventType.ROLLOUT_WAVE), _data("wave"))).alias("waves_done"),
    )
    per_vehicle = ev.where(_t(EventType.ROLLOUT_VEHICLE)).select(
        "rollout", "vid", _data("result").alias("result"), _data("failure").alias("failure"))

    def distinct_when(cond: Column) -> Column:
        return F.countDistinct(F.when(cond, F.col("vid")))

    vehicles = per_vehicle.groupBy("rollout").agg(
        distinct_when(F.col("result") == "converged").alias("converged"),
        distinct_when(F.col("result") == "failed").alias("failed"),
        distinct_when(F.col("result") == "rolled_back").alias("rolled_back"),
        *[distinct_when((F.col("result") == "failed") & (F.col("failure") == k)).alias(f"failed_{k}")
          for k in FAILURES],
    )
    counts = ["converged", "failed", "rolled_back", *[f"failed_{k}" for k in FAILURES]]
    return (fleet.join(vehicles, "rollout", "left")
            .fillna(0, subset=counts)
            .withColumn("outcome", F.coalesce("outcome", F.lit("running")))
            .withColumn("duration_s", F.unix_micros("ended") / 1e6 - F.unix_micros("started") / 1e6)
            .select("rollout", "started", "ended", "outcome", "targets", "waves", "waves_done", "max_failures",
                    "change", *counts, "duration_s")
            .orderBy("started"))
