"""`mavjet bench NAME`: each benchmark prints its figures and writes JSON,
against a baseline measured in the same run (docs/benchmarks.md)."""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = {
    "ingest": "benchmarks.ingest",
    "commands": "benchmarks.commands",
    "shadow": "benchmarks.shadow",
    "replay": "benchmarks.replay",
    "mixed": "benchmarks.mixed",
    "consumers": "benchmarks.consumers",
    "compare": "benchmarks.compare",
    "uplink": "benchmarks.uplink",
    "overload": "benchmarks.overload",
    "scrape": "benchmarks.scrape",
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: mavjet bench {" + ",".join(BENCHMARKS) + "} [options]")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    module = BENCHMARKS.get(name)
    if module is None:
        print(f"mavjet bench: unknown benchmark {name!r}", file=sys.stderr)
        return 2
    rc: int = importlib.import_module(module).main(rest)
    return rc
