"""The flight recorder's samples (TWIN_TRACKS) as a DataFrame for the per-flight jobs and pages.

The gateway's recorder (gateway/stores/recorder.py) publishes one envelope per
sample on `fleet.<env>.veh.<vid>.track` while a vehicle is armed; its keys
(lat_deg, lon_deg, alt_m, alt_msl_m, battery_pct) are the event snapshot's,
so the `jetstream` source decodes them into its typed columns like any
event. This module only points that source at TWIN_TRACKS, with the same
server, credentials and time range as the events being replayed, and keeps
the columns `mavjet.analytics.fleet.flight_samples` takes (TRACK_COLUMNS).

A server without the stream (provisioned before the recorder existed), or
with nothing in it, gives None: the pages then draw the sparse track the
events carry, as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mavjet.analytics import natsread
from mavjet.analytics.options import SourceOptions, format_time_us
from mavjet.contract.subjects import TRACKS_STREAM, track_subject

# What the jobs read of a sample (mavjet.analytics.fleet.TRACK_COLUMNS, plus the altitude above sea level).
COLUMNS = ("vid", "time", "lat_deg", "lon_deg", "alt_m", "alt_msl_m", "battery_pct")
# Taken over from the events' source options; everything else is the tracks' own.
_SHARED = ("url", "creds", "start_time", "end_time", "partitions", "timeout")


def track_options(
    event_options: Mapping[str, str], env: str, *, vids: Sequence[str] = (), start_us: int | None = None,
    end_us: int | None = None,
) -> dict[str, str]:
    """The `jetstream` source options for TWIN_TRACKS matching a replay's options for TWIN_EVENTS.

    `vids` narrows the read to those vehicles' subjects (the server filters);
    `start_us`/`end_us` (epoch µs, end exclusive) replace the events' time range.
    """
    opts = {k: v for k, v in event_options.items() if k in _SHARED}
    subjects = ",".join(track_subject(env, v) for v in vids) if vids else track_subject(env, "*")
    opts.update({"stream": TRACKS_STREAM, "subjects": subjects, "data": "false"})
    if start_us is not None:
        opts["start_time"] = format_time_us(start_us)  # ISO with µs: exact, unlike epoch seconds in a float
    if end_us is not None:
        opts["end_time"] = format_time_us(end_us)
    return opts


def has_samples(options: Mapping[str, str]) -> bool:
    """True when TWIN_TRACKS exists on the server and holds at least one message."""
    try:
        return natsread.latest_seq(SourceOptions.from_options(options)) > 0
    except natsread.SourceError:
        return False  # no such stream here (or it cannot be read): the events' own positions serve


def read_tracks(spark: Any, options: Mapping[str, str]) -> Any | None:
    """The samples as a DataFrame with COLUMNS (rows that failed to decode left out), or None without any."""
    if not has_samples(options):
        return None
    reader = spark.read.format("jetstream")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load().where("error IS NULL").select(*COLUMNS)


@dataclass(frozen=True, slots=True)
class TrackReader:
    """A `mavjet.analytics.flightpages.TrackSource` over TWIN_TRACKS: reads only the vehicles and span asked for."""

    spark: Any
    event_options: Mapping[str, str]
    env: str

    def __call__(self, vids: Sequence[str], start_us: int | None, end_us: int | None) -> Any | None:
        return read_tracks(self.spark, track_options(self.event_options, self.env, vids=vids, start_us=start_us,
                                                     end_us=end_us))
