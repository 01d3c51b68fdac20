"""Fleet-level jobs: command -> cmd_result -> effect chains, fleet KPIs, per-flight tracks and events.

Pure DataFrame -> DataFrame functions like mavjet.analytics.jobs (which they build
on); `mavjet.analytics.replay` writes their outputs and the report draws them.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from mavjet.analytics.jobs import _seconds_between, _summary, _t, valid, with_flight
from mavjet.contract.events import EFFECTS as CATALOGUE_EFFECTS
from mavjet.contract.events import EventType

# Command name -> (the event its effect shows up as, how long after the
# command was sent that event still counts as its effect, in seconds): the
# catalogue's `confirms` (contract/events.py), as plain strings for Spark.
EFFECTS: dict[str, tuple[str, float]] = {c.value: (t.value, w) for c, (t, w) in CATALOGUE_EFFECTS.items()}
# Results after which the vehicle may have acted on the command. A rejected,
# failed, expired or invalid command did nothing, whatever happened next.
EFFECT_RESULTS = ("accepted", "timeout", "unknown")
# The event types command_chains reads: commands' answers and their effects.
COMMAND_EVENT_TYPES = (EventType.CMD_RESULT.value, *sorted({v[0] for v in EFFECTS.values()}))
ARMED = EventType.ARMED.value


def _map(pairs: dict[str, object]) -> Column:
    return F.create_map(*[x for k, v in pairs.items() for x in (F.lit(k), F.lit(v))])


def command_chains(events: DataFrame) -> DataFrame:
    """One row per cmd_result: the command, its answer and the effect it had.

    `issued` is the answer's time minus its latency (when the gateway first
    sent it). The effect is the first event of the expected type (EFFECTS) at
    or after `issued`, before the vehicle's next command with the same kind
    of effect was issued (that one is now the likelier cause), and within the
    command's window, in the same arm session as the command's answer (an
    arm's effect may open the next one): a `land` accepted on the ground is
    not "effected" by the landing of a later flight; only for results in
    EFFECT_RESULTS. set_mode is
    matched to the next mode change whatever the mode, as cmd_result does
    not carry the requested mode. Columns: vid, cmd_id, name, result,
    latency_ms, attempts, issued, acked, effect_type, effect_time, effect_seq,
    effect_latency_ms (issued -> effect), and `expects_effect`.
    """
    ev = valid(with_flight(events))
    kind = _map({k: v[0] for k, v in EFFECTS.items()})
    window_s = _map({k: v[1] for k, v in EFFECTS.items()})
    lat_us = F.coalesce((F.col("latency_ms") * 1000).cast("long"), F.lit(0))
    is_cmd = _t(EventType.CMD_RESULT)
    name = F.coalesce("cmd_name", F.lit("?"))
    issued = F.timestamp_micros(F.unix_micros("time") - lat_us)
    # Commands and candidate effects in one frame, partitioned by vehicle and
    # kind of effect. Walking each partition backwards (newest first), the
    # last effect and the last command seen are the first ones *after* the
    # current row: one sort, running frames only (an unbounded-following
    # frame would be quadratic in Spark), no join. One filtered projection of
    # the events, not a union of two: vid passes through unchanged, so the
    # cache's partitioning by vid satisfies the window and there is no
    # second shuffle (a union loses the partitioning).
    key = F.struct("_t", "_kind", "_seq", "_fno")  # ordered by time, kind, seq: the flight rides along
    both = ev.where(F.col("type").isin(*COMMAND_EVENT_TYPES)).select(
        "vid",
        F.col("seq").alias("ack_seq"),
        "cmd_id",
        name.alias("name"),
        "result",
        "latency_ms",
        "attempts",
        F.col("time").alias("acked"),
        issued.alias("issued"),
        F.when(is_cmd, kind[name]).alias("effect_type"),
        F.when(is_cmd, window_s[name]).alias("_window_s"),
        F.when(is_cmd, F.coalesce(kind[name], F.lit(""))).otherwise(F.col("type")).alias("_key"),
        F.when(is_cmd, issued).otherwise(F.col("time")).alias("_t"),
        F.when(is_cmd, F.lit(0)).otherwise(F.lit(1)).alias("_kind"),
        F.col("seq").alias("_seq"),
        F.col("flight_no").alias("_fno"),
    )
    newest_first = Window.partitionBy("vid", "_key").orderBy(
        F.desc("_t"), F.desc("_kind"), F.desc("_seq")
    ).rowsBetween(Window.unboundedPreceding, -1)
    out = (
        both.withColumn("_next_effect", F.last(F.when(F.col("_kind") == 1, key), ignorenulls=True).over(newest_first))
        .withColumn("_next_cmd", F.last(F.when(F.col("_kind") == 0, key), ignorenulls=True).over(newest_first))
        .where(F.col("_kind") == 0)
        .withColumn(
            "_et",
            F.when(
                F.col("_next_cmd").isNull() | (F.col("_next_effect") < F.col("_next_cmd")), F.col("_next_effect._t")
            ),
        )
        .withColumn("_es", F.when(F.col("_et").isNotNull(), F.col("_next_effect._seq")))
        .withColumn("_sessions", F.col("_next_effect._fno") - F.col("_fno"))
    )
    ok = (
        F.col("effect_type").isNotNull()
        & F.col("result").isin(*EFFECT_RESULTS)
        & F.col("_et").isNotNull()
        & (_seconds_between(F.col("issued"), F.col("_et")) <= F.col("_window_s"))
        # same arm session; an `armed` effect opens the next one (its answer may come just before or after it)
        & ((F.col("_sessions") == 0) | ((F.col("effect_type") == F.lit(ARMED)) & (F.col("_sessions") == 1)))
    )
    return out.select(
        "vid",
        "cmd_id",
        "name",
        "result",
        "latency_ms",
        "attempts",
        "issued",
        "acked",
        F.col("ack_seq"),
        "effect_type",
        (F.col("effect_type").isNotNull() & F.col("result").isin(*EFFECT_RESULTS)).alias("expects_effect"),
        F.when(ok, F.col("_et")).alias("effect_time"),
        F.when(ok, F.col("_es")).alias("effect_seq"),
        F.when(ok, _seconds_between(F.col("issued"), F.col("_et")) * 1000.0).alias("effect_latency_ms"),
    )


def chain_latency(chains: DataFrame) -> DataFrame:
    """Per command name: commands, effects seen, and latency to effect p50/p95."""
    return chains.groupBy("name").agg(
        F.count("*").alias("count"),
        F.sum(F.when(F.col("expects_effect"), 1).otherwise(0)).alias("expected"),
        F.count("effect_time").alias("effects"),
        F.percentile("effect_latency_ms", F.lit(0.5)).alias("effect_p50_ms"),
        F.percentile("effect_latency_ms", F.lit(0.95)).alias("effect_p95_ms"),
    )


def fleet_kpis(flights: DataFrame, chains: DataFrame) -> DataFrame:
    """One row: flights, vehicles, flight_hours (airborne: takeoff -> landed,
    else armed time), failsafes, failsafe_rate (flights with a failsafe /
    flights), failsafes_per_100h, commands, command_success_rate (accepted /
    answered), median_cmd_latency_ms (accepted commands), median_effect_latency_ms."""
    f = flights.agg(
        F.count("*").alias("flights"),
        F.countDistinct("vid").alias("vehicles"),
        (F.sum(F.coalesce("air_s", "duration_s")) / 3600.0).alias("flight_hours"),
        F.sum("failsafes").cast("long").alias("failsafes"),
        F.sum(F.when(F.col("failsafes") > 0, 1).otherwise(0)).alias("_fs_flights"),
    )
    c = chains.agg(
        F.count("*").alias("commands"),
        F.sum(F.when(F.col("result") == "accepted", 1).otherwise(0)).alias("_accepted"),
        F.percentile(F.when(F.col("result") == "accepted", F.col("latency_ms")), F.lit(0.5)).alias(
            "median_cmd_latency_ms"
        ),
        F.percentile("effect_latency_ms", F.lit(0.5)).alias("median_effect_latency_ms"),
    )
    return f.crossJoin(c).select(
        "flights",
        "vehicles",
        "flight_hours",
        "failsafes",
        (F.col("_fs_flights") / F.col("flights")).alias("failsafe_rate"),
        (F.col("failsafes") * 100.0 / F.col("flight_hours")).alias("failsafes_per_100h"),
        "commands",
        (F.col("_accepted") / F.col("commands")).alias("command_success_rate"),
        "median_cmd_latency_ms",
        "median_effect_latency_ms",
    )


TRACK_COLUMNS = ("vid", "time", "lat_deg", "lon_deg", "alt_m", "battery_pct")


def flight_samples(events: DataFrame, track: DataFrame | None = None) -> DataFrame:
    """Position/altitude/battery samples per flight: (vid, flight_no, time, lat_deg,
    lon_deg, alt_m, battery_pct, source), ordered by time within a flight.

    Every event carries the vehicle's snapshot, so the events alone give a
    sparse track (one sample per event). `track` is an optional denser
    position stream with TRACK_COLUMNS (a recorder's 1 Hz samples; a missing
    battery_pct is fine): its samples are assigned to the flight whose
    armed..disarmed span holds them and merged in.
    """
    ev = with_flight(events).where("in_flight")
    samples = ev.where(F.col("lat_deg").isNotNull() | F.col("alt_m").isNotNull() | F.col("battery_pct").isNotNull())
    out = samples.select("vid", "flight_no", "time", "lat_deg", "lon_deg", "alt_m", "battery_pct", F.lit("event").alias("source"))
    if track is None:
        return out
    spans = ev.groupBy("vid", "flight_no").agg(F.min("time").alias("_s"), F.max("time").alias("_e"))
    tr = track.select(
        "vid", "time", "lat_deg", "lon_deg", "alt_m",
        (F.col("battery_pct") if "battery_pct" in track.columns else F.lit(None).cast("double")).alias("battery_pct"),
    )
    joined = tr.join(spans, "vid").where((F.col("time") >= F.col("_s")) & (F.col("time") <= F.col("_e")))
    return out.unionByName(
        joined.select("vid", "flight_no", "time", "lat_deg", "lon_deg", "alt_m", "battery_pct", F.lit("track").alias("source"))
    )


def flight_events(events: DataFrame) -> DataFrame:
    """Every event of every flight with a readable summary: (vid, flight_no, time, seq, type, mode, alt_m,
    battery_pct, lat_deg, lon_deg, summary); the position places failsafes, mode changes and commands on
    the flight page's track."""
    ev = with_flight(events).where("in_flight")
    return ev.select(
        "vid", "flight_no", "time", "seq", "type", "mode", "alt_m", "battery_pct", "lat_deg", "lon_deg",
        _summary().alias("summary"),
    )
