"""Prometheus metrics for the gateway.

Hot-path counters (messages by type, CRC errors, sequence gaps) are not
incremented per message: the codec already counts them, and a collector reads
those counts through each vehicle's session (`Session.health()`) at scrape
time. Each gateway gets its own registry so several can
run in one process (tests, benchmarks).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from drivers.mavlink.link import LinkState
from drivers.mavlink.session import Session
from gateway.contract.errors import ConfigError

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class _LinkCollector(Collector):
    def __init__(self, sessions: Callable[[], Iterable[Session]]) -> None:
        self._sessions = sessions

    def collect(self) -> Iterator[Any]:
        msgs = CounterMetricFamily("mavjet_mavlink_messages", "MAVLink messages received", labels=["vid", "type"])
        crc = CounterMetricFamily("mavjet_mavlink_crc_errors", "MAVLink frames with a bad CRC", labels=["vid"])
        bad = CounterMetricFamily("mavjet_mavlink_bad_data", "Bytes skipped as garbage or unknown frames", labels=["vid"])
        gaps = CounterMetricFamily("mavjet_mavlink_seq_gaps", "MAVLink frames missing by sequence number", labels=["vid"])
        up = GaugeMetricFamily("mavjet_link_up", "1 while heartbeats arrive from the vehicle", labels=["vid"])
        age = GaugeMetricFamily("mavjet_heartbeat_age_seconds", "Seconds since the last vehicle heartbeat", labels=["vid"])
        for session in self._sessions():
            vid = session.name
            h = session.health()
            for t, n in list(h.by_type.items()):
                msgs.add_metric([vid, t], n)
            crc.add_metric([vid], h.crc_errors)
            bad.add_metric([vid], h.bad_data)
            gaps.add_metric([vid], h.seq_gaps)
            up.add_metric([vid], 1.0 if h.state is LinkState.UP else 0.0)
            age.add_metric([vid], float("nan") if h.heartbeat_age_s is None else h.heartbeat_age_s)
        yield from (msgs, crc, bad, gaps, up, age)


class _SigningCollector(Collector):
    """Frames dropped by MAVLink signature verification, read at scrape time from each link's codec."""

    def __init__(self, rejected: Callable[[], Iterable[tuple[str, Mapping[str, int]]]]) -> None:
        self._rejected = rejected

    def collect(self) -> Iterator[Any]:
        fam = CounterMetricFamily(
            "mavjet_mavlink_signing_rejected",
            "MAVLink frames dropped on a signing link: unsigned, bad_signature, replay, stale", labels=["vid", "reason"],
        )
        for vid, by_reason in self._rejected():
            for reason, n in list(by_reason.items()):
                fam.add_metric([vid, reason], n)
        yield fam


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.publishes = Counter(
            "mavjet_publishes", "JetStream publishes by kind and result", ["kind", "result"], registry=r
        )
        self.publish_latency = Histogram(
            "mavjet_publish_latency_seconds",
            "From MAVLink receive (state) or spool (events) to JetStream ack",
            ["kind"], buckets=LATENCY_BUCKETS, registry=r,
        )
        self.errors = Counter("mavjet_errors", "Errors handled without stopping the gateway", ["where"], registry=r)
        self.nats_connected = Gauge("mavjet_nats_connected", "1 while connected to NATS", registry=r)
        self.nats_reconnects = Counter("mavjet_nats_reconnects", "NATS reconnections", registry=r)
        self.spool_depth = Gauge("mavjet_spool_depth", "Events waiting in the on-disk spool", registry=r)
        self.spool_dropped = Counter(
            "mavjet_spool_dropped", "Spooled events dropped at the bound, by class (gateway.spool)", ["class"],
            registry=r,
        )
        self.events = Counter("mavjet_events", "Events detected", ["type"], registry=r)
        self.events_suppressed = Counter(
            "mavjet_events_suppressed", "Events held back by a vehicle's event budget (not published)", ["type"],
            registry=r,
        )
        self.commands = Counter("mavjet_commands", "Commands finished by result", ["name", "result"], registry=r)
        self.loop_tick = Gauge(
            "mavjet_loop_last_tick_timestamp_seconds",
            "Unix time of the gateway's last publish tick (a stale value means a hung event loop)",
            registry=r,
        )

    def watch_sessions(self, sessions: Callable[[], Iterable[Session]]) -> None:
        self.registry.register(_LinkCollector(sessions))

    def watch_signing(self, rejected: Callable[[], Iterable[tuple[str, Mapping[str, int]]]]) -> None:
        """`rejected()` → (vid, {reason: frames dropped}) per vehicle; empty for links without a key."""
        self.registry.register(_SigningCollector(rejected))

    def serve(self, host: str, port: int) -> int:
        """Serve /metrics on a daemon thread; returns the bound port. A port in use is a ConfigError."""
        try:
            server, _thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise ConfigError("metrics.port", f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        bound: int = server.server_address[1]
        return bound
