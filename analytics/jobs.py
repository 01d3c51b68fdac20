"""The replay jobs: pure DataFrame -> DataFrame functions over decoded events.

Input is what the `jetstream` source returns (mavjet.analytics.columns). Nothing
here reads or writes: `mavjet.analytics.replay` wires the source, the jobs and the
outputs together, and tests feed the functions directly.

Ordering inside a vehicle is (time, seq): `time` is when the event happened
(the envelope), `seq` breaks ties in the order the gateway published.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from mavjet.contract.events import EventType, FlightEdge, flight_edge

CMD_RESULTS = ("accepted", "rejected", "failed", "expired", "invalid", "timeout")
EARTH_RADIUS_M = 6_371_000.0
# A vehicle's events are split into flights at these (the catalogue's `flight`).
FLIGHT_START = flight_edge(FlightEdge.START)
FLIGHT_END = flight_edge(FlightEdge.END)
# An arm session is a flight only when the vehicle was airborne: a `takeoff` or `landed` event, or (data from
# before the gateway reported takeoffs) an altitude above this (m above home). Armed on the ground and
# disarmed again (a refused start, an auto-disarm after 10 s) is not a flight.
AIRBORNE_ALT_M = 2.0


def _t(name: EventType) -> Column:
    """Rows of event type `name` (a catalogue member: contract/events.py)."""
    return F.col("type") == F.lit(name.value)


def valid(events: DataFrame) -> DataFrame:
    """Rows that decoded: error rows are reported, never joined into results."""
    return events.where(_valid_cond())


def time_range(events: DataFrame, start: dt.datetime | None, end: dt.datetime | None) -> DataFrame:
    """Events with start <= time < end (either bound optional)."""
    if start is not None:
        events = events.where(F.col("time") >= F.lit(start))
    if end is not None:
        events = events.where(F.col("time") < F.lit(end))
    return events


def _seconds_between(a: Column, b: Column) -> Column:
    return (F.unix_micros(b) - F.unix_micros(a)) / F.lit(1_000_000.0)


def _valid_cond() -> Column:
    return F.col("error").isNull() & F.col("time").isNotNull() & F.col("vid").isNotNull()


def add_flight_columns(events: DataFrame) -> DataFrame:
    """`flight_no` and `in_flight` (see with_flight) on every row, error rows kept.

    Only valid rows count, so the numbers on the valid rows are exactly
    with_flight's. A caller that runs several jobs (the replay) caches this
    once: with_flight then finds the columns and skips its window passes.

    One sort: both columns come from running windows over the vehicle's
    events in (time, seq) order. flight_no only grows in that order, so the
    first `disarmed` of the current flight seen so far is the greatest
    (flight_no, -time) among the disarms up to the row; a row before it in
    its flight is in flight (its time is at most the disarm's), as before.
    The rows come out sorted by (vid, time, seq), which is also their order
    by flight: the per-flight jobs window over that order without sorting.
    """
    ok = _valid_cond()
    running = Window.partitionBy("vid").orderBy("time", "seq").rowsBetween(Window.unboundedPreceding, 0)
    ev = events.withColumn("flight_no", F.sum(F.when(_t(FLIGHT_START) & ok, 1).otherwise(0)).over(running))
    # same window: Spark evaluates it on the same sorted rows, no second sort
    first_disarm = F.max(
        F.when(
            _t(FLIGHT_END) & ok,
            F.struct(F.col("flight_no").alias("f"), (-F.unix_micros("time")).alias("neg_us")),
        )
    ).over(running)
    ev = ev.withColumn("_disarm", first_disarm)
    disarm_us = F.when(F.col("_disarm.f") == F.col("flight_no"), -F.col("_disarm.neg_us"))
    return ev.withColumn(
        "in_flight",
        (F.col("flight_no") > 0) & (disarm_us.isNull() | (F.unix_micros("time") <= disarm_us)),
    ).drop("_disarm")


def with_flight(events: DataFrame) -> DataFrame:
    """Add `flight_no` (armed events so far for the vehicle, 0 before the first)
    and `in_flight` (between an armed event and the disarmed that closes it)."""
    if "flight_no" in events.columns and "in_flight" in events.columns:
        return valid(events)
    return add_flight_columns(valid(events))


def _haversine_m(lat1: Column, lon1: Column, lat2: Column, lon2: Column) -> Column:
    p1, p2 = F.radians(lat1), F.radians(lat2)
    dp, dl = p2 - p1, F.radians(lon2) - F.radians(lon1)
    a = F.pow(F.sin(dp / 2), 2) + F.cos(p1) * F.cos(p2) * F.pow(F.sin(dl / 2), 2)
    # least() skips nulls, so a missing previous position must be ruled out
    # explicitly or the first leg of every flight would be half the planet.
    known = lat1.isNotNull() & lon1.isNotNull() & lat2.isNotNull() & lon2.isNotNull()
    return F.when(known, F.lit(2 * EARTH_RADIUS_M) * F.asin(F.least(F.lit(1.0), F.sqrt(a))))


def _flight_commands(ev: DataFrame) -> DataFrame:
    """Per (vid, flight_no): the commands answered from the previous flight's
    disarm to this flight's disarm (so the arm that started it is included)."""
    c = ev.where(_t(EventType.CMD_RESULT)).withColumn(
        "flight_no", F.when(F.col("in_flight"), F.col("flight_no")).otherwise(F.col("flight_no") + 1)
    )
    return c.groupBy("vid", "flight_no").agg(
        F.transform(
            F.array_sort(F.collect_list(F.struct("time", "seq", F.col("cmd_name").alias("name"), "result", "latency_ms"))),
            lambda s: s.dropFields("seq"),
        ).alias("commands"),
        F.count("*").alias("command_count"),
        F.sum(F.when(F.col("result") == "accepted", 1).otherwise(0)).cast("int").alias("commands_accepted"),
    )


def flights(events: DataFrame) -> DataFrame:
    """One row per flight: an arm session (armed -> disarmed) in which the vehicle was airborne.

    The columns of `arm_sessions`; `flight_no` stays the vehicle's arm count
    (a session on the ground leaves a gap in the numbers).
    """
    return arm_sessions(events).where(F.col("airborne"))


def arm_sessions(events: DataFrame) -> DataFrame:
    """One row per arm session (armed -> disarmed) per vehicle, `airborne` or not.

    start, end (null while still armed), duration_s, max_alt_m, distance_m,
    battery_used_pct, modes (visited, in order), failsafes, failsafe_types.
    Distance and battery come from the disarmed event's summary when the
    gateway reported one, otherwise from the positions and battery readings
    carried by the flight's events. Then takeoff_time, landing_time (first
    takeoff, last landed), air_s between them, max_speed_mps (the highest
    mean ground speed between two consecutive position samples: a lower
    bound of the true maximum, as close as the samples are dense), and the
    flight's commands (time, name, result, latency_ms) with counts.
    `airborne`: a takeoff or landing was reported, or the altitude went
    above AIRBORNE_ALT_M.
    """
    ev_all = with_flight(events)
    ev = ev_all.where("in_flight")
    # The previous sample within the flight: the vehicle's previous in-flight
    # row when it belongs to the same flight. Ordered per vehicle, not per
    # flight, as the replay's cache already is (add_flight_columns): no sort.
    order = Window.partitionBy("vid").orderBy("time", "seq")
    same_flight = F.lag("flight_no").over(order) == F.col("flight_no")

    def prev(c: str) -> Column:
        return F.when(same_flight, F.lag(c).over(order))

    ev = ev.withColumn(
        "_leg_m", _haversine_m(prev("lat_deg"), prev("lon_deg"), F.col("lat_deg"), F.col("lon_deg"))
    ).withColumn("_leg_s", _seconds_between(prev("time"), F.col("time")))
    ts = F.struct("time", "seq")
    agg = ev.groupBy("vid", "flight_no").agg(
        F.min(F.when(_t(FLIGHT_START), F.col("time"))).alias("start"),
        F.max(F.when(_t(FLIGHT_END), F.col("time"))).alias("end"),
        F.greatest(F.max("alt_m"), F.max("max_alt_m")).alias("max_alt_m"),
        F.max(F.when(_t(EventType.DISARMED), F.col("distance_m"))).alias("_reported_distance_m"),
        F.sum("_leg_m").alias("_track_m"),
        F.max(F.when(_t(EventType.DISARMED), F.col("battery_used_pct"))).alias("_reported_battery_pct"),
        F.min_by("battery_pct", F.when(F.col("battery_pct").isNotNull(), ts)).alias("_first_batt"),
        F.max_by("battery_pct", F.when(F.col("battery_pct").isNotNull(), ts)).alias("_last_batt"),
        F.array_sort(F.collect_list(F.when(F.col("mode").isNotNull(), F.struct("time", "seq", "mode")))).alias(
            "_modes"
        ),
        F.sum(F.when(_t(EventType.FAILSAFE), 1).otherwise(0)).cast("int").alias("failsafes"),
        F.array_sort(F.collect_set(F.when(_t(EventType.FAILSAFE), F.col("failsafe_type")))).alias("failsafe_types"),
        F.count("*").alias("events"),
        F.min(F.when(_t(EventType.TAKEOFF), F.col("time"))).alias("takeoff_time"),
        F.max(F.when(_t(EventType.LANDED), F.col("time"))).alias("landing_time"),
        F.max(F.when(F.col("_leg_s") > 0, F.col("_leg_m") / F.col("_leg_s"))).alias("max_speed_mps"),
    )
    agg = agg.join(_flight_commands(ev_all), ["vid", "flight_no"], "left")
    return agg.where(F.col("start").isNotNull()).select(
        "vid",
        "flight_no",
        "start",
        "end",
        _seconds_between(F.col("start"), F.col("end")).alias("duration_s"),
        "max_alt_m",
        F.coalesce("_reported_distance_m", "_track_m").alias("distance_m"),
        F.coalesce("_reported_battery_pct", F.col("_first_batt") - F.col("_last_batt")).alias("battery_used_pct"),
        F.array_distinct(F.transform("_modes", lambda s: s["mode"])).alias("modes"),
        "failsafes",
        "failsafe_types",
        "events",
        F.col("end").isNotNull().alias("complete"),
        "takeoff_time",
        "landing_time",
        _seconds_between(F.col("takeoff_time"), F.col("landing_time")).alias("air_s"),
        "max_speed_mps",
        "commands",  # null when the flight had none
        F.coalesce("command_count", F.lit(0)).alias("command_count"),
        F.coalesce("commands_accepted", F.lit(0)).alias("commands_accepted"),
        (
            F.col("takeoff_time").isNotNull()
            | F.col("landing_time").isNotNull()
            | (F.coalesce("max_alt_m", F.lit(0.0)) > AIRBORNE_ALT_M)
        ).alias("airborne"),
    )


def commands(events: DataFrame) -> DataFrame:
    """Per command name and vehicle: count, result mix and latency p50/p95/p99 (exact)."""
    c = valid(events).where(_t(EventType.CMD_RESULT))
    return (
        c.groupBy(F.coalesce("cmd_name", F.lit("?")).alias("name"), "vid")
        .agg(
            F.count("*").alias("count"),
            *[F.sum(F.when(F.col("result") == r, 1).otherwise(0)).alias(r) for r in CMD_RESULTS],
            *_latency_percentiles(),
        )
    )


ALL_RESULTS = "all"  # command_latency's subtotal row per name


def command_latency(events: DataFrame) -> DataFrame:
    """Fleet-wide per command name and result kind: count, vehicles, latency percentiles.

    One row per (name, result): a rejected arm answered after 420 ms and an
    accepted one after 4 ms are different measurements, never one median.
    Plus one row per name with result ALL_RESULTS (one pass: a rollup) for
    the name's totals (count, distinct vehicles); `command_mix` folds the
    rows into one per name with the result mix.
    """
    c = valid(events).where(_t(EventType.CMD_RESULT))
    rolled = c.rollup(
        F.coalesce("cmd_name", F.lit("?")).alias("name"), F.coalesce("result", F.lit("?")).alias("result")
    ).agg(
        F.count("*").alias("count"),
        F.countDistinct("vid").alias("vehicles"),
        *_latency_percentiles(),
    )
    return rolled.where(F.col("name").isNotNull()).withColumn("result", F.coalesce("result", F.lit(ALL_RESULTS)))


def command_mix(latency_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per name (sorted): count, vehicles and the result mix, from `command_latency`'s collected rows."""
    out: dict[str, dict[str, Any]] = {}
    for r in sorted(latency_rows, key=lambda r: (r["name"], r["result"])):
        row = out.setdefault(r["name"], {"name": r["name"], "count": 0, "vehicles": 0, **dict.fromkeys(CMD_RESULTS, 0)})
        if r["result"] == ALL_RESULTS:
            row["count"], row["vehicles"] = int(r["count"]), int(r["vehicles"])
        else:
            row[r["result"]] = int(r["count"])
    return [out[k] for k in sorted(out)]


def _latency_percentiles() -> list[Column]:
    return [
        F.percentile("latency_ms", F.lit(0.5)).alias("latency_p50_ms"),
        F.percentile("latency_ms", F.lit(0.95)).alias("latency_p95_ms"),
        F.percentile("latency_ms", F.lit(0.99)).alias("latency_p99_ms"),
    ]


def failsafe_events(events: DataFrame) -> DataFrame:
    """Every failsafe with what it did and how long until the vehicle was on the ground.

    `landed_time` is the first `landed` after the failsafe within the same
    flight; null when the vehicle did not land (yet) in the data read.
    """
    # Only failsafes and landings matter to the window (a few % of the
    # events): sorting those per flight is cheap, all events would not be.
    ev = with_flight(events).where(_t(EventType.FAILSAFE) | _t(EventType.LANDED))
    after = Window.partitionBy("vid", "flight_no").orderBy("time", "seq").rowsBetween(1, Window.unboundedFollowing)
    ev = ev.withColumn("landed_time", F.min(F.when(_t(EventType.LANDED), F.col("time"))).over(after))
    return ev.where(_t(EventType.FAILSAFE)).select(
        "vid",
        "time",
        "seq",
        F.coalesce("failsafe_type", F.lit("unknown")).alias("failsafe_type"),
        "action_taken",
        "mode",
        "alt_m",
        "battery_pct",
        "in_flight",
        "landed_time",
        _seconds_between(F.col("time"), F.col("landed_time")).alias("time_to_landed_s"),
    )


def failsafes(events: DataFrame) -> DataFrame:
    """Failsafe counts by day, vehicle and type, with time from failsafe to landed."""
    return failsafe_counts(failsafe_events(events))


def failsafe_counts(fs: DataFrame) -> DataFrame:
    """`failsafes` from the output of `failsafe_events` (which a caller may already hold)."""
    return fs.groupBy(F.to_date("time").alias("day"), "vid", "failsafe_type").agg(
        F.count("*").alias("count"),
        F.count("landed_time").alias("landed"),
        F.avg("time_to_landed_s").alias("avg_time_to_landed_s"),
        F.max("time_to_landed_s").alias("max_time_to_landed_s"),
    )


def _fmt(c: str, digits: int = 1) -> Column:
    return F.coalesce(F.format_number(F.col(c), digits), F.lit("?"))


def _s(c: str) -> Column:
    return F.coalesce(F.col(c).cast("string"), F.lit("?"))


def _summary() -> Column:
    return (
        F.when(F.col("error").isNotNull(), F.concat(F.lit("undecodable: "), F.col("error")))
        .when(_t(EventType.MODE_CHANGED), F.concat(_s("previous_mode"), F.lit(" -> "), _s("mode")))
        .when(_t(EventType.FAILSAFE), F.concat(F.lit("FAILSAFE "), _s("failsafe_type"), F.lit(" -> "), _s("action_taken")))
        .when(
            _t(EventType.CMD_RESULT),
            F.concat(_s("cmd_name"), F.lit(" "), _s("result"), F.lit(" in "), _fmt("latency_ms"), F.lit(" ms")),
        )
        .when(_t(EventType.STATUSTEXT), F.concat(F.lit("["), _s("severity"), F.lit("] "), _s("text")))
        .when(_t(EventType.MISSION_ITEM_REACHED), F.concat(F.lit("reached mission item "), _s("mission_seq")))
        .when(
            _t(EventType.LANDED),
            F.concat(F.lit("landed after "), _fmt("flight_s"), F.lit(" s, max alt "), _fmt("max_alt_m"), F.lit(" m")),
        )
        .when(
            _t(EventType.DISARMED),
            F.concat(
                F.lit("disarmed: "), _fmt("distance_m", 0), F.lit(" m flown, "),
                _fmt("battery_used_pct"), F.lit(" % battery used"),
            ),
        )
        .when(_t(EventType.LINK_RESTORED), F.concat(F.lit("link restored after "), _fmt("outage_s"), F.lit(" s")))
        .otherwise(F.col("type"))
    )


def timeline(
    events: DataFrame, vid: str, start: dt.datetime | None = None, end: dt.datetime | None = None
) -> DataFrame:
    """The ordered story of one vehicle over [start, end): one line per event."""
    ev = time_range(events.where(F.col("vid") == F.lit(vid)), start, end)
    return ev.select(
        "time", "seq", "vid", "type", "mode", "armed", "alt_m", "battery_pct", "lat_deg", "lon_deg",
        _summary().alias("summary"),
    ).orderBy("time", "seq")
