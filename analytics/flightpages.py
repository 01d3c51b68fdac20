"""Which flights get a page in the report, and the data each page needs (Spark side).

A fleet has far too many flights for a page each; the report gets one for
the latest flights, the latest flights with a failsafe, and the flights of
the vehicles asked for with `--vid`. The rows collected here go to
analytics.flightreport, which renders them without Spark.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from analytics import fleet
from analytics.flightreport import PAGES_DIR, flight_file, flight_page

LATEST = 10
LATEST_WITH_FAILSAFE = 10
PER_VID = 50


class TrackSource(Protocol):
    """Recorded positions (`vid, time, lat_deg, lon_deg, alt_m, battery_pct`) of some vehicles over a span.

    `start_us`/`end_us`: epoch µs, start inclusive, end exclusive, None for open;
    None back when there is nothing recorded (analytics.tracks.TrackReader).
    """

    def __call__(self, vids: Sequence[str], start_us: int | None, end_us: int | None) -> DataFrame | None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class FlightData:
    flight: dict[str, Any]
    samples: list[dict[str, Any]]
    events: list[dict[str, Any]]


def select_flights(flights: DataFrame, vids: tuple[str, ...] = ()) -> DataFrame:
    """(vid, flight_no) of the flights that get a page."""
    keys = ["vid", "flight_no"]
    chosen = flights.orderBy(F.desc("start")).limit(LATEST).select(*keys)
    chosen = chosen.unionByName(
        flights.where(F.col("failsafes") > 0).orderBy(F.desc("start")).limit(LATEST_WITH_FAILSAFE).select(*keys)
    )
    if vids:
        latest_first = Window.partitionBy("vid").orderBy(F.desc("start"))
        own = flights.where(F.col("vid").isin(*vids)).withColumn("_n", F.row_number().over(latest_first))
        chosen = chosen.unionByName(own.where(F.col("_n") <= PER_VID).select(*keys))
    return chosen.distinct()


def collect_flights(
    events: DataFrame, flights: DataFrame, vids: tuple[str, ...] = (), track: DataFrame | TrackSource | None = None
) -> list[FlightData]:
    """The chosen flights' rows, samples and events.

    `track`: recorded positions (the flight recorder's TWIN_TRACKS), as a
    DataFrame or as a TrackSource, which is asked for the chosen flights'
    vehicles and span only (a fleet's 90 days of tracks are never read for
    a few pages).
    """
    keys = select_flights(flights, vids).collect()
    if not keys:
        return []
    pairs = [(r["vid"], int(r["flight_no"])) for r in keys]
    spark = events.sparkSession
    key_df = F.broadcast(spark.createDataFrame(pairs, "vid string, flight_no int"))
    chosen_vids = sorted({v for v, _ in pairs})
    # flight_no is counted per vehicle, so keeping only these vehicles' events keeps it right
    mine = events.where(F.col("vid").isin(*chosen_vids))
    chosen = flights.join(key_df, ["vid", "flight_no"])
    rows = chosen.collect()
    if track is not None and not isinstance(track, DataFrame):
        span = chosen.agg(F.min(F.unix_micros("start")).alias("lo"), F.max(F.unix_micros("end")).alias("hi"),
                          F.count(F.when(F.col("end").isNull(), 1)).alias("open")).first()
        assert span is not None  # an aggregate without groups has one row
        # end exclusive: the disarm sample is timed at the disarmed event, the flight's end
        track = track(chosen_vids, span["lo"], None if span["open"] or span["hi"] is None else span["hi"] + 1)
    samples: dict[tuple[str, int], list[dict[str, Any]]] = {p: [] for p in pairs}
    for s in fleet.flight_samples(mine, track).join(key_df, ["vid", "flight_no"]).collect():
        samples[(s["vid"], int(s["flight_no"]))].append(s.asDict())
    evs: dict[tuple[str, int], list[dict[str, Any]]] = {p: [] for p in pairs}
    for e in fleet.flight_events(mine).join(key_df, ["vid", "flight_no"]).orderBy("time", "seq").collect():
        evs[(e["vid"], int(e["flight_no"]))].append(e.asDict())
    out = []
    for r in sorted(rows, key=lambda r: (r["vid"], r["flight_no"])):
        k = (r["vid"], int(r["flight_no"]))
        flight = r.asDict(recursive=True)
        # how many of the samples the flight recorder took (TWIN_TRACKS); the rest come from the events
        flight["track_samples"] = sum(1 for s in samples[k] if s.get("source") == "track")
        out.append(FlightData(flight=flight, samples=samples[k], events=evs[k]))
    return out


def write_pages(out_dir: Path, data: list[FlightData]) -> list[dict[str, Any]]:
    """Write one page per flight under out_dir/PAGES_DIR/; return the front page's links."""
    links = []
    (out_dir / PAGES_DIR).mkdir(parents=True, exist_ok=True)
    for fd in data:
        f = fd.flight
        href = flight_file(f["vid"], int(f["flight_no"]))
        (out_dir / href).write_text(flight_page(f, fd.samples, fd.events), encoding="utf-8")
        links.append({
            "vid": f["vid"], "flight_no": f["flight_no"], "href": href,
            "start": f["start"].isoformat(sep=" ", timespec="seconds") if f.get("start") else None,
            "air_s": f.get("air_s"), "distance_m": f.get("distance_m"), "max_alt_m": f.get("max_alt_m"),
            "failsafes": f.get("failsafes"),
        })
    return links
