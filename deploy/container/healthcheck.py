#!/usr/bin/env python3
"""Container health check for the mavjet gateway: scrape its metrics endpoint.

Standard library only, so the image needs neither curl nor wget. Exit 0 when
healthy, 1 when not (the HEALTHCHECK contract), with one line saying why.

Healthy means: GET /metrics answers 200 within the timeout with Prometheus
text that contains mavjet metrics, every `--require NAME` metric is present
with a value > 0 in at least one sample, and every `--max-age NAME=SECONDS`
timestamp gauge is fresher than SECONDS.

Defaults come from the environment so the Containerfile's HEALTHCHECK stays a
plain `python healthcheck.py`: MAVJET_METRICS_URL (default
http://127.0.0.1:${MAVJET_METRICS_PORT:-9108}/metrics), MAVJET_HEALTH_REQUIRE
(comma-separated names) and MAVJET_HEALTH_TIMEOUT_S (default 3).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
import urllib.error
import urllib.request

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_samples(text: str) -> dict[str, list[float]]:
    """Prometheus text exposition -> {metric name: [sample values]} (labels dropped)."""
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out.setdefault(m.group(1), []).append(value)
    return out


def check(text: str, require: list[str], max_age: dict[str, float], now: float) -> str | None:
    """None if healthy, else the reason."""
    samples = parse_samples(text)
    if not any(name.startswith("mavjet_") for name in samples):
        return "no mavjet metrics in the response"
    for name in require:
        values = samples.get(name)
        if not values:
            return f"{name} is missing"
        if not any(v > 0 for v in values):
            return f"{name} is 0"
    for name, limit_s in max_age.items():
        values = samples.get(name)
        if not values:
            return f"{name} is missing"
        age = now - max(values)
        if age > limit_s:
            return f"{name} is {age:.0f}s old (limit {limit_s:.0f}s)"
    return None


def main(argv: list[str] | None = None) -> int:
    port = os.environ.get("MAVJET_METRICS_PORT", "9108")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default=os.environ.get("MAVJET_METRICS_URL", f"http://127.0.0.1:{port}/metrics"),
                   help="the gateway's metrics endpoint (env MAVJET_METRICS_URL; default %(default)s)")
    p.add_argument("--require", action="append",
                   default=[s for s in os.environ.get("MAVJET_HEALTH_REQUIRE", "").split(",") if s],
                   help="a metric that must have a sample > 0 (repeatable)")
    p.add_argument("--max-age", action="append", default=[], metavar="NAME=SECONDS",
                   help="a unix-time gauge that must be fresher than SECONDS (repeatable)")
    p.add_argument("--timeout", type=float, default=float(os.environ.get("MAVJET_HEALTH_TIMEOUT_S", "3")),
                   help="seconds to wait for the endpoint (env MAVJET_HEALTH_TIMEOUT_S; default %(default)s)")
    args = p.parse_args(argv)
    max_age: dict[str, float] = {}
    for item in args.max_age:
        name, sep, limit = item.partition("=")
        if not sep:
            p.error(f"--max-age {item!r}: expected NAME=SECONDS")
        max_age[name] = float(limit)
    try:
        with urllib.request.urlopen(args.url, timeout=args.timeout) as resp:
            if resp.status != 200:
                print(f"unhealthy: {args.url} answered {resp.status}")
                return 1
            text = resp.read(16 * 1024 * 1024).decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"unhealthy: {args.url}: {exc}")
        return 1
    reason = check(text, args.require, max_age, time.time())
    if reason is not None:
        print(f"unhealthy: {reason}")
        return 1
    print("healthy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
