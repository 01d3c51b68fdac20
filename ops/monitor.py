"""`mavjet monitor`: JetStream stream health as Prometheus metrics, one per hub.

Reads the JetStream API every `--interval` (mavjet.ops.health) and serves the
latest snapshot on `--listen`. Collecting on a timer rather than at scrape time
keeps the JetStream API load independent of how many Prometheus servers scrape
and how often; a scrape never waits on NATS. When a collection fails the
previous numbers are dropped (stale lag figures are worse than none) and
`mavjet_monitor_up` goes to 0, which rules.yml alerts on.

`--once` prints the snapshot and every crossed threshold instead, and exits 1
if there is any: a quick check for an operator or a cron job.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio
from nats.aio.client import Client
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from mavjet.contract import natsconn
from mavjet.contract.errors import ConfigError
from mavjet.contract.units import parse_duration_s
from mavjet.ops.console import console, is_tty, rich_table
from mavjet.ops.health import Health, Thresholds, collect_health, evaluate
from mavjet.ops.runner import run_cli

DEFAULT_LISTEN = "127.0.0.1:9464"


class HealthCollector(Collector):
    """Turns the latest Health snapshot into metric families at scrape time."""

    def __init__(self, thresholds: Thresholds) -> None:
        self.thresholds = thresholds
        self._lock = threading.Lock()
        self._health: Health | None = None
        self._last_success: float | None = None
        self._errors = 0
        self._collections = 0

    def update(self, health: Health | None) -> None:
        """Publish a new snapshot (None: the last collection failed)."""
        with self._lock:
            self._collections += 1
            self._health = health
            if health is None:
                self._errors += 1
            else:
                self._last_success = time.time()

    def collect(self) -> Iterator[Any]:
        with self._lock:
            health, last, errors, runs = self._health, self._last_success, self._errors, self._collections
        up = GaugeMetricFamily("mavjet_monitor_up", "1 if the last JetStream API read succeeded")
        up.add_metric([], 1.0 if health is not None else 0.0)
        yield up
        err = CounterMetricFamily("mavjet_monitor_collect_errors", "JetStream API reads that failed")
        err.add_metric([], errors)
        yield err
        runs_m = CounterMetricFamily("mavjet_monitor_collections", "JetStream API reads attempted")
        runs_m.add_metric([], runs)
        yield runs_m
        if last is not None:
            ts = GaugeMetricFamily("mavjet_monitor_last_success_timestamp_seconds",
                                   "Unix time of the last successful read")
            ts.add_metric([], last)
            yield ts
        t = self.thresholds
        for name, value, text in (
            ("mavjet_threshold_consumer_lag_messages", t.consumer_lag_msgs, "Alert threshold for consumer lag"),
            ("mavjet_threshold_stream_bytes_ratio", t.bytes_ratio, "Alert threshold for bytes / max_bytes"),
            ("mavjet_threshold_ack_pending_messages", t.ack_pending_msgs, "Alert threshold for ack pending"),
        ):
            g = GaugeMetricFamily(name, text)
            g.add_metric([], float(value))
            yield g
        if health is not None:
            yield from health_families(health)


def health_families(health: Health) -> Iterator[Any]:
    """Pure: a Health snapshot as Prometheus metric families."""
    s_lbl, c_lbl, r_lbl = ["stream"], ["stream", "consumer"], ["stream", "peer"]
    msgs = GaugeMetricFamily("mavjet_stream_messages", "Messages stored in the stream", labels=s_lbl)
    size = GaugeMetricFamily("mavjet_stream_bytes", "Bytes stored in the stream", labels=s_lbl)
    maxb = GaugeMetricFamily("mavjet_stream_max_bytes", "The stream's max_bytes limit (streams with one)",
                             labels=s_lbl)
    ratio = GaugeMetricFamily("mavjet_stream_bytes_ratio", "Stream bytes as a fraction of max_bytes",
                              labels=s_lbl)
    reps = GaugeMetricFamily("mavjet_stream_replicas", "Configured replicas", labels=s_lbl)
    leader = GaugeMetricFamily("mavjet_stream_leader_present",
                               "1 if the clustered stream has a leader (always 1 on a single server)",
                               labels=s_lbl)
    for s in health.streams:
        msgs.add_metric([s.stream], s.messages)
        size.add_metric([s.stream], s.bytes)
        reps.add_metric([s.stream], s.replicas)
        leader.add_metric([s.stream], 1.0 if (s.leader or not s.clustered) else 0.0)
        r = s.bytes_ratio
        if r is not None:
            maxb.add_metric([s.stream], s.max_bytes)
            ratio.add_metric([s.stream], r)
    yield from (msgs, size, maxb, ratio, reps, leader)

    pend = GaugeMetricFamily("mavjet_consumer_pending_messages",
                             "Consumer lag: messages in the stream not yet delivered", labels=c_lbl)
    ackp = GaugeMetricFamily("mavjet_consumer_ack_pending_messages",
                             "Messages delivered and not yet acknowledged", labels=c_lbl)
    redel = GaugeMetricFamily("mavjet_consumer_redelivered_messages",
                              "Messages delivered more than once and still unacknowledged", labels=c_lbl)
    wait = GaugeMetricFamily("mavjet_consumer_waiting_requests", "Pull requests waiting", labels=c_lbl)
    for c in health.consumers:
        key = [c.stream, c.consumer]
        pend.add_metric(key, c.num_pending)
        ackp.add_metric(key, c.num_ack_pending)
        redel.add_metric(key, c.num_redelivered)
        wait.add_metric(key, c.num_waiting)
    yield from (pend, ackp, redel, wait)

    lag = GaugeMetricFamily("mavjet_stream_replica_lag", "Operations a follower is behind the leader",
                            labels=r_lbl)
    cur = GaugeMetricFamily("mavjet_stream_replica_current", "1 if the follower is current", labels=r_lbl)
    off = GaugeMetricFamily("mavjet_stream_replica_offline", "1 if the follower is offline", labels=r_lbl)
    for rep in health.replicas:
        key = [rep.stream, rep.peer]
        lag.add_metric(key, rep.lag)
        cur.add_metric(key, 1.0 if rep.current else 0.0)
        off.add_metric(key, 1.0 if rep.offline else 0.0)
    yield from (lag, cur, off)


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError("--listen", f"{text!r}: expected HOST:PORT, e.g. {DEFAULT_LISTEN}")
    return host.strip("[]") or "127.0.0.1", int(port)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mavjet monitor",
        description="Export consumer lag, ack pending, stream bytes / max_bytes and replica lag of every "
        "TWIN_* stream as Prometheus metrics (alert rules: deploy/prometheus/rules.yml).",
    )
    natsconn.add_nats_arguments(p)
    p.add_argument("--listen", default=DEFAULT_LISTEN, help="HOST:PORT for /metrics (default %(default)s)")
    p.add_argument("--interval", default="5s", help="how often to read the JetStream API (default %(default)s)")
    p.add_argument("--timeout", default="5s", help="deadline for one read of the JetStream API")
    p.add_argument("--once", action="store_true", help="print health and crossed thresholds, exit 1 if any")
    p.add_argument("--json", action="store_true", help="with --once: streams, consumers, replicas and problems as JSON")
    return p


def format_report(health: Health, thresholds: Thresholds) -> str:
    lines = ["streams:"]
    for s in health.streams:
        r = s.bytes_ratio
        ratio = f" ({r:.1%} of max)" if r is not None else ""
        lines.append(f"  {s.stream:16} msgs={s.messages} bytes={s.bytes}{ratio} replicas={s.replicas}"
                     + (f" leader={s.leader}" if s.leader else ""))
    if health.consumers:
        lines.append("consumers:")
        lines += [f"  {c.stream}/{c.consumer}: pending={c.num_pending} ack_pending={c.num_ack_pending}"
                  for c in health.consumers]
    if health.replicas:
        lines.append("replicas:")
        lines += [f"  {r.stream}/{r.peer}: current={r.current} offline={r.offline} lag={r.lag}"
                  for r in health.replicas]
    problems = evaluate(health, thresholds)
    lines.append("problems:" if problems else "problems: none")
    lines += ["  " + p.describe() for p in problems]
    return "\n".join(lines)


def report_json(health: Health, thresholds: Thresholds) -> dict[str, Any]:
    """`--once --json`: the snapshot's fields as they are named in mavjet.ops.health, plus the problems."""
    return {
        "streams": [{**dataclasses.asdict(s), "bytes_ratio": s.bytes_ratio} for s in health.streams],
        "consumers": [dataclasses.asdict(c) for c in health.consumers],
        "replicas": [dataclasses.asdict(r) for r in health.replicas],
        "problems": [dataclasses.asdict(p) for p in evaluate(health, thresholds)],
    }


def print_report(health: Health, thresholds: Thresholds) -> None:
    """`--once` on a terminal: the same facts as format_report, as tables."""
    out = console()
    out.print(rich_table(
        ["STREAM", "MSGS", "BYTES", "OF MAX", "REPLICAS", "LEADER"],
        [[s.stream, f"{s.messages:,}", f"{s.bytes:,}", "-" if s.bytes_ratio is None else f"{s.bytes_ratio:.1%}",
          str(s.replicas), s.leader or "-"] for s in health.streams],
        title="streams", right=["MSGS", "BYTES", "OF MAX", "REPLICAS"]))
    if health.consumers:
        out.print(rich_table(["STREAM", "CONSUMER", "PENDING", "ACK PENDING"],
                             [[c.stream, c.consumer, f"{c.num_pending:,}", f"{c.num_ack_pending:,}"]
                              for c in health.consumers],
                             title="consumers", right=["PENDING", "ACK PENDING"]))
    if health.replicas:
        out.print(rich_table(["STREAM", "PEER", "CURRENT", "OFFLINE", "LAG"],
                             [[r.stream, r.peer, str(r.current), str(r.offline), f"{r.lag:,}"]
                              for r in health.replicas], title="replicas", right=["LAG"]))
    problems = evaluate(health, thresholds)
    if problems:
        out.print(rich_table(["PROBLEM", "WHERE", "DETAIL"], [[p.kind, p.subject, p.detail] for p in problems],
                             title="[bold red]problems[/]"))
    else:
        out.print("problems: [green]none[/]")


async def _connect(args: argparse.Namespace, *, persistent: bool) -> Client:
    opts = natsconn.options_from_args(args, name="mavjet-monitor")
    if not persistent:
        return await natsconn.connect_once(opts)
    return await natsconn.connect_once(opts, allow_reconnect=True, max_reconnect_attempts=-1,
                                       reconnect_time_wait=1.0)


async def run(args: argparse.Namespace) -> int:
    interval_s = parse_duration_s(args.interval)
    timeout_s = parse_duration_s(args.timeout)
    if interval_s <= 0 or timeout_s <= 0:
        raise ConfigError("--interval", "interval and timeout must be > 0")
    thresholds = Thresholds()
    if args.json and not args.once:
        raise ConfigError("--json", "--json goes with --once (the exporter serves /metrics)")
    if args.once:
        nc = await _connect(args, persistent=False)
        try:
            with anyio.fail_after(timeout_s * 4):
                health = await collect_health(nc.jetstream(timeout=timeout_s))
        finally:
            await nc.close()
        if args.json:
            print(json.dumps(report_json(health, thresholds), indent=2))
        elif is_tty():
            print_report(health, thresholds)
        else:
            print(format_report(health, thresholds))
        return 1 if evaluate(health, thresholds) else 0

    host, port = parse_listen(args.listen)
    collector = HealthCollector(thresholds)
    registry = CollectorRegistry()
    registry.register(collector)
    server, _thread = start_http_server(port, addr=host, registry=registry)
    print(f"mavjet monitor: serving http://{host}:{server.server_address[1]}/metrics", flush=True)
    nc = await _connect(args, persistent=True)
    js = nc.jetstream(timeout=timeout_s)
    try:
        while True:
            started = time.monotonic()
            try:
                with anyio.fail_after(timeout_s * 4):
                    collector.update(await collect_health(js))
            except Exception as exc:  # NATS down, no JetStream leader, timeouts: report, keep serving
                collector.update(None)
                print(f"mavjet monitor: read failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            await asyncio.sleep(max(0.0, interval_s - (time.monotonic() - started)))
    finally:
        server.shutdown()
        with contextlib.suppress(Exception):
            await nc.close()


def main(argv: list[str]) -> int:
    return run_cli(build_parser(), run, argv, errors=(ValueError,))
