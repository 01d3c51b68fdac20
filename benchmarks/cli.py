"""`mavjet bench NAME`: each benchmark prints its figures and writes JSON (`kit.default_json`:
benchmarks/results/ inside a checkout), against a baseline measured in the same run (docs/benchmarks.md)."""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, what it measures). Order is the order shown in `mavjet bench --help`.
BENCHMARKS: dict[str, tuple[str, str]] = {
    "ingest": ("mavjet.benchmarks.ingest",
               "MAVLink in, JetStream state out: gateway CPU per message, state rate, p99 latency"),
    "commands": ("mavjet.benchmarks.commands", "command round trips and throughput, closed loop per vehicle"),
    "shadow": ("mavjet.benchmarks.shadow", "desired write -> reported.converged across simulated vehicles"),
    "replay": ("mavjet.benchmarks.replay", "the Spark data source's read rate against one process's ceiling"),
    "mixed": ("mavjet.benchmarks.mixed", "command p50/p99 while a fleet streams state, and the state delivered"),
    "consumers": ("mavjet.benchmarks.consumers", "server memory and command round trip at 1k/5k/10k durable consumers"),
    "compare": ("mavjet.benchmarks.compare", "a benchmark from a git ref and from the working tree alternately, and "
                                      "their ratio"),
    "uplink": ("mavjet.benchmarks.uplink", "command results and failsafe events over a thin uplink, shaping on and off"),
    "overload": ("mavjet.benchmarks.overload", "the ingest knee, then twice that fleet: what graceful overload keeps"),
    "scrape": ("mavjet.benchmarks.scrape", "what one /metrics scrape costs the gateway's process"),
    "scale": ("mavjet.benchmarks.scale", "command consumers per gateway vs per vehicle, 100-10k vehicles: "
                                         "server memory, re-bind, p99"),
    "shadow-watch": ("mavjet.benchmarks.shadow_watch", "one shadow watch per gateway against one per vehicle: "
                                                       "consumers, first values delivered"),
    "failover": ("mavjet.benchmarks.failover", "two gateways for a vehicle: takeover after SIGKILL, handover after "
                                               "SIGTERM, state gap, commands' results"),
}


def usage() -> str:
    lines = ["usage: mavjet bench NAME [options]   (mavjet bench NAME --help for details)", "",
             "Each benchmark prints progress and its figures, writes JSON, and measures its baseline in the",
             "same run (these machines' speed drifts between hours). docs/benchmarks.md has the results.",
             "The JSON goes to benchmarks/results/NAME-STAMP.json inside a checkout, to",
             "bench-NAME-STAMP.json in the working directory otherwise (STAMP: UTC time); --json FILE wins.", "",
             "benchmarks:"]
    lines += [f"  {name:<12} {summary}" for name, (_, summary) in BENCHMARKS.items()]
    lines += ["", "example: mavjet bench ingest --vehicles 1000 --duration 20"]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """Every benchmark's parser under its name (shell completion, and the help-text test)."""
    p = argparse.ArgumentParser(prog="mavjet bench", description="Benchmarks that print figures and write JSON, "
                                "each against a baseline measured in the same run.")
    sub = p.add_subparsers(dest="benchmark", metavar="NAME")
    for name, (module, summary) in BENCHMARKS.items():
        try:
            own: argparse.ArgumentParser = importlib.import_module(module).build_parser()
        except ImportError:  # replay without pyspark: completed by name only
            sub.add_parser(name, help=summary, description=summary)
            continue
        sub.add_parser(name, parents=[own], add_help=False, help=summary, description=own.description,
                       formatter_class=own.formatter_class)
    return p


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    entry = BENCHMARKS.get(name)
    if entry is None:
        print(f"mavjet bench: unknown benchmark {name!r} (one of: {', '.join(BENCHMARKS)})", file=sys.stderr)
        return 2
    rc: int = importlib.import_module(entry[0]).main(rest)
    return rc
