"""`mavjet bench scrape --vehicles N`: what one /metrics scrape costs the gateway's process.

    mavjet bench scrape --vehicles 1000 --rounds 20 --json scrape-1000.json

A scrape is built on the metrics thread while the event loop waits for the
GIL, so its cost is time the fleet's MAVLink and commands wait. This serves
one `GatewayMetrics` with N vehicles' link counters twice on loopback and
times real HTTP GETs of each, alternating, in both formats Prometheus asks
for (OpenMetrics first, then text):

- the page as served (gateway/runtime/linkmetrics.py formats the per-vehicle
  families itself);
- baseline, in the same run: the same registry served by prometheus_client's
  own app, which formats every series (what the gateway served before).

The vehicles' counters are fixed values of the shape a live link reports
(`LinkHealth`); both pages read them the same way, so the difference is the
formatting. Prints the figures and writes JSON.
"""

from __future__ import annotations

import argparse
import gzip
import time
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client import make_wsgi_app

from mavjet.benchmarks.kit import default_json, percentile, positive_int, report
from mavjet.drivers.mavlink.link import LinkState
from mavjet.drivers.mavlink.session import LinkHealth
from mavjet.gateway.runtime.metrics import GatewayMetrics, serve_app

OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"  # Prometheus' Accept
FORMATS = {"openmetrics": OPENMETRICS, "text": "text/plain;version=0.0.4"}
TYPES = ("HEARTBEAT", "SYS_STATUS", "GLOBAL_POSITION_INT", "ATTITUDE", "VFR_HUD", "GPS_RAW_INT", "BATTERY_STATUS",
         "EXTENDED_SYS_STATE", "HOME_POSITION", "RC_CHANNELS", "SERVO_OUTPUT_RAW", "STATUSTEXT", "SYSTEM_TIME",
         "TIMESYNC", "PARAM_VALUE")


class _Vehicle:
    def __init__(self, i: int) -> None:
        self.name = f"VID-{i:05d}"
        self._h = LinkHealth(state=LinkState.UP, endpoint=f"udp:127.0.0.1:{20000 + i}", messages_in=1_234_567 + i,
                             crc_errors=i % 3, bad_data=i % 5, seq_gaps=i % 7, connects=1, heartbeat_age_s=0.4,
                             by_type={t: 1000 + i for t in TYPES})

    def health(self) -> LinkHealth:
        return self._h


def get_page_ms(url: str, accept: str, *, gz: bool = True) -> tuple[float, int]:
    """One GET of a /metrics page: its wall time in ms, and its lines."""
    headers = {"Accept": accept, **({"Accept-Encoding": "gzip"} if gz else {})}
    req = urllib.request.Request(url, headers=headers)
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=30) as resp:
        body = resp.read()
    ms = (time.perf_counter() - t0) * 1000
    if resp.headers.get("Content-Encoding") == "gzip":
        body = gzip.decompress(body)
    return ms, body.count(b"\n")


def run(args: argparse.Namespace) -> dict[str, Any]:
    fleet = [_Vehicle(i) for i in range(args.vehicles)]
    gm = GatewayMetrics()
    gm.watch_sessions(lambda: fleet)  # type: ignore[arg-type,return-value]  # name and health() are all it reads
    served = gm.serve("127.0.0.1", 0)
    baseline = serve_app(make_wsgi_app(gm.registry), "127.0.0.1", 0)
    urls = {"served": f"http://127.0.0.1:{served}/metrics", "baseline": f"http://127.0.0.1:{baseline}/metrics"}
    times: dict[str, list[float]] = {f"{side}.{fmt}": [] for side in urls for fmt in FORMATS}
    lines: dict[str, int] = {}
    for r in range(args.rounds + 1):  # round 0 warms both up and is not counted
        for side, url in (urls.items() if r % 2 else reversed(urls.items())):
            for fmt, accept in FORMATS.items():
                ms, n = get_page_ms(url, accept)
                if r:
                    times[f"{side}.{fmt}"].append(ms)
                    lines[f"{side}.{fmt}"] = n
        if r and r % 5 == 0:
            print(f"  round {r}/{args.rounds}", flush=True)
    res: dict[str, Any] = {"vehicles": args.vehicles, "rounds": args.rounds}
    for key, series in times.items():
        res[key] = {"p50_ms": percentile(series, 0.5), "p90_ms": percentile(series, 0.9), "lines": lines[key]}
    for fmt in FORMATS:
        base, new = res[f"baseline.{fmt}"]["p50_ms"], res[f"served.{fmt}"]["p50_ms"]
        res[f"ratio_p50.{fmt}"] = round(new / base, 3) if base else None
    return res


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mavjet bench scrape", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vehicles", type=positive_int, default=1000, help="vehicles whose link families are on the page")
    p.add_argument("--rounds", type=positive_int, default=20, help="scrapes of each page in each format")
    p.add_argument("--json", type=Path, default=None, help="write results here "
                   "(default: benchmarks/results/scrape-N-STAMP.json in a checkout, docs/benchmarks.md)")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    print(f"scraping {args.vehicles} vehicles' pages, {args.rounds} rounds", flush=True)
    res = run(args)
    report(res, args.json or default_json(f"scrape-{args.vehicles}"), width=36)
    return 0
