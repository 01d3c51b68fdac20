"""Which flights get a page in the report, and the data each page needs (Spark side).

A fleet has far too many flights for a page each; the report gets one for
the latest flights, the latest flights with a failsafe, and the flights of
the vehicles asked for with `--vid`. The rows collected here go to
mavjet.analytics.flightreport, which renders them without Spark.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from mavjet.analytics import fleet
from mavjet.analytics.flightreport import PAGES_DIR, flight_file, flight_page

LATEST = 10
LATEST_WITH_FAILSAFE = 10
PER_VID = 50


class TrackSource(Protocol):
    """Recorded positions (`vid, time, lat_deg, lon_deg, alt_m, battery_pct`) of some vehicles over a span.

    `start_us`/`end_us`: epoch µs, start inclusive, end exclusive, None for open;
    None back when there is nothing recorded (mavjet.analytics.tracks.TrackReader).
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
    # one action for the chosen flights' rows (each action costs ~1 s of planning here);
    # the keys and the span come from them
    rows = flights.join(select_flights(flights, vids), ["vid", "flight_no"]).collect()
    if not rows:
        return []
    pairs = [(r["vid"], int(r["flight_no"])) for r in rows]
    spark = events.sparkSession
    key_df = F.broadcast(spark.createDataFrame(pairs, "vid string, flight_no int"))
    chosen_vids = sorted({v for v, _ in pairs})
    # flight_no is counted per vehicle, so keeping only these vehicles' events keeps it right
    mine = events.where(F.col("vid").isin(*chosen_vids))
    if track is not None and not isinstance(track, DataFrame):
        starts = [_epoch_us(r["start"]) for r in rows if r["start"] is not None]
        ends = [_epoch_us(r["end"]) for r in rows if r["end"] is not None]
        lo = min(starts) if starts else None
        # end exclusive: the disarm sample is timed at the disarmed event, the flight's end
        hi = None if len(ends) < len(rows) or not ends else max(ends) + 1
        track = track(chosen_vids, lo, hi)
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


def _epoch_us(t: dt.datetime) -> int:
    """Epoch µs of a collected Spark timestamp (naive local time, or aware), exactly."""
    if t.tzinfo is None:
        t = t.astimezone()  # naive means the process's local time, as pyspark hands it out
    return (t - _EPOCH) // dt.timedelta(microseconds=1)


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


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
