"""Prometheus metrics for the gateway.

Hot-path counters (messages by type, CRC errors, sequence gaps) are not
incremented per message: the codec already counts them, and
gateway/runtime/linkmetrics.py reads those counts through each vehicle's session
(`Session.health()`) at scrape time and formats those families itself (a
scrape's cost is the event loop's). Each gateway gets its own registry so
several can run in one process (tests, benchmarks).

Names follow Prometheus conventions: counters end in `_total`, units are
base units in the name (`_seconds`, `_bytes`), per-vehicle series carry a
`vid` label. docs/operations.md ("Gateway metrics") lists them, with the
table of names renamed from earlier releases.

With `--workers N` the supervisor serves one /metrics (`WorkersMetrics`): it
scrapes each worker's loopback endpoint when it is scraped and adds a
`worker` label, so dashboards sum over workers as they would over gateways.
"""

from __future__ import annotations

import importlib.metadata
import platform
import socket
import threading
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler

from nats import errors as nats_errors
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    make_wsgi_app,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from mavjet.contract import __version__
from mavjet.contract.errors import ConfigError
from mavjet.drivers.mavlink.router import RouteStats
from mavjet.drivers.mavlink.session import Session
from mavjet.gateway.publish.uplink import UplinkMetrics
from mavjet.gateway.runtime.linkmetrics import GatewayRegistry, LinkMetrics, WSGIApp

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
# A command takes one round trip (arm: ~50 ms) up to a whole climb or mission upload (tens of seconds).
COMMAND_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
# `mavjet_nats_auth_errors_total{reason}`: what the server refused (see nats_auth_reason).
NATS_AUTH_REASONS = ("authorization", "permissions")


def nats_auth_reason(exc: BaseException) -> str | None:
    """`authorization` (credentials refused), `permissions` (a subject refused) or None for other NATS errors."""
    # nats-py raises AuthorizationError for some refusals and a plain Error carrying the server's
    # `-ERR 'Authorization Violation'` / `'Permissions Violation for ...'` text for others (connect, publish).
    text = str(exc).lower()
    if isinstance(exc, nats_errors.AuthorizationError) or "authorization violation" in text:
        return "authorization"
    if "permissions violation" in text:
        return "permissions"
    return None


def _dist_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # a scrape is not a log line
        return None


def serve_app_on(app: WSGIApp, sock: socket.socket) -> int:
    """Serve a /metrics WSGI app on a listening socket made elsewhere; returns its port.

    A `--workers` worker gets its socket from the supervisor (inherited, already
    listening), so no other process can take the port between the supervisor
    choosing it and the worker binding it, and a restarted worker serves on the
    same port without a bind at all.
    """
    server = ThreadingWSGIServer(sock.getsockname()[:2], _QuietHandler, bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    host, port = sock.getsockname()[:2]
    server.server_address = (host, port)
    server.server_name, server.server_port = host, port  # what HTTPServer.server_bind would set
    server.setup_environ()
    server.set_app(app)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    bound: int = port
    return bound


def serve_app(app: WSGIApp, host: str, port: int) -> int:
    """Serve a /metrics WSGI app on a daemon thread; returns the bound port. A port in use is a ConfigError."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        sock = socket.create_server((host, port), family=family)
    except OSError as exc:
        raise ConfigError("metrics.port", f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return serve_app_on(app, sock)


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


class _RouteCollector(Collector):
    """Per-route frame and byte counts (gateway/routes.py), read at scrape time: routing counts nothing per frame here."""

    def __init__(self, routes: Callable[[], Iterable[tuple[str, str, RouteStats]]]) -> None:
        self._routes = routes

    def collect(self) -> Iterator[Any]:
        frames = CounterMetricFamily("mavjet_route_frames", "MAVLink frames routed, by direction (out: to the route)",
                                     labels=["vid", "route", "direction"])
        nbytes = CounterMetricFamily("mavjet_route_bytes", "MAVLink bytes routed, by direction",
                                     labels=["vid", "route", "direction"])
        dropped = CounterMetricFamily("mavjet_route_dropped", "Frames not routed: filtered, loop, dropped, refused",
                                      labels=["vid", "route", "reason"])
        for vid, route, st in self._routes():
            frames.add_metric([vid, route, "out"], st.frames_out)
            frames.add_metric([vid, route, "in"], st.frames_in)
            nbytes.add_metric([vid, route, "out"], st.bytes_out)
            nbytes.add_metric([vid, route, "in"], st.bytes_in)
            for reason in ("filtered", "loops", "dropped", "refused"):
                dropped.add_metric([vid, route, reason], getattr(st, reason))
        yield from (frames, nbytes, dropped)


class _SupersededCollector(Collector):
    """State samples replaced before their publish turn, fleet-wide, read at scrape time (no work per sample)."""

    def __init__(self, superseded: Callable[[], int]) -> None:
        self._superseded = superseded

    def collect(self) -> Iterator[Any]:
        fam = CounterMetricFamily(
            "mavjet_state_superseded",
            "State samples a newer one replaced before their publish turn: rate decimation of vehicles "
            "sending faster than the configured rates, and state shed by an overloaded gateway (older frames "
            "of a read that fell behind are not even decoded)",
        )
        fam.add_metric([], self._superseded())
        yield fam


@dataclass(frozen=True, slots=True, kw_only=True)
class OwnershipStatus:
    """What /metrics shows of ownership at a scrape (gateway/ownership/service.py)."""

    states: Mapping[str, str]  # vid -> this gateway's lease state (owner, standby, fenced, ...)
    holders: Mapping[str, str | None]  # vid -> the owner as far as this gateway knows
    takeovers: int
    renew_latency_s: float | None
    refused: Mapping[str, int]  # vid -> frames not sent to the vehicle for want of the lease
    presence_writes: int = 0  # presence records written or deleted (a standby's; gateway/ownership/presence.py)
    presence_failures: int = 0


class _OwnershipCollector(Collector):
    def __init__(self, status: Callable[[], OwnershipStatus]) -> None:
        self._status = status

    def collect(self) -> Iterator[Any]:
        st = self._status()
        owner = GaugeMetricFamily("mavjet_vehicle_owner", "1 while this gateway owns the vehicle and may act for it",
                                  labels=["vehicle"])
        state = GaugeMetricFamily("mavjet_vehicle_lease_state", "This gateway's lease state per vehicle (1 = current)",
                                  labels=["vehicle", "state", "holder"])
        for vid, s in st.states.items():
            owner.add_metric([vid], 1.0 if s == "owner" else 0.0)
            state.add_metric([vid, s, st.holders.get(vid) or ""], 1.0)
        takeovers = CounterMetricFamily("mavjet_lease_takeovers", "Leases this gateway took over from a stale owner")
        takeovers.add_metric([], st.takeovers)
        latency = GaugeMetricFamily("mavjet_lease_renew_latency_seconds", "The newest successful lease renew's round trip")
        if st.renew_latency_s is not None:
            latency.add_metric([], st.renew_latency_s)
        refused = CounterMetricFamily("mavjet_actions_refused_not_owner",
                                      "Frames not sent to the vehicle because this gateway was not its owner (standby or fenced)",
                                      labels=["vehicle"])
        for vid, n in st.refused.items():
            refused.add_metric([vid], n)
        # This gateway's vehicles by its role: a handful of series whatever the fleet's size. Standbys per
        # vehicle are an aggregation over the gateways' `mavjet_vehicle_lease_state{state="standby"}`
        # (docs/ownership.md), not one more per-vehicle series here.
        roles = GaugeMetricFamily("mavjet_vehicles_by_role", "How many of this gateway's vehicles it is owner of, "
                                  "standby for, or fenced/releasing for", labels=["role"])
        counts: dict[str, int] = {}
        for s in st.states.values():
            counts[s] = counts.get(s, 0) + 1
        for role in ("owner", "standby", *sorted(set(counts) - {"owner", "standby"})):
            roles.add_metric([role], counts.get(role, 0))
        presence = CounterMetricFamily("mavjet_presence_writes", "A standby's presence records written or deleted "
                                       "(result=failed: not stored, retried at the vehicle's next turn)",
                                       labels=["result"])
        presence.add_metric(["stored"], st.presence_writes)
        presence.add_metric(["failed"], st.presence_failures)
        yield from (owner, state, takeovers, latency, refused, roles, presence)


class GatewayMetrics:
    def __init__(self) -> None:
        # No `<name>_created` series: they double the series count and no rule or panel reads them.
        # The switch is process-wide in prometheus_client; the gateway's process exports nothing else.
        disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in prometheus_client
        self.registry = GatewayRegistry()  # the link families formatted by gateway/runtime/linkmetrics.py when served
        r = self.registry
        self.build_info = Gauge(
            "mavjet_build_info", "Always 1; the labels say what runs", ["version", "python", "nats_py", "pymavlink"],
            registry=r,
        )
        self.build_info.labels(
            version=__version__, python=platform.python_version(),
            nats_py=_dist_version("nats-py"), pymavlink=_dist_version("pymavlink"),
        ).set(1)
        # result: acked (JetStream stored it), plain (state sent without an ack, see Publisher),
        # error (no ack in time), dropped (not sent: NATS down or too many in flight).
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
        self.nats_auth_errors = Counter(
            "mavjet_nats_auth_errors", "NATS errors for refused credentials or subjects", ["reason"], registry=r
        )
        for reason in NATS_AUTH_REASONS:  # exported at 0 from the start, so an alert can use increase()
            self.nats_auth_errors.labels(reason)
        self.spool_depth = Gauge("mavjet_spool_depth", "Events waiting in the on-disk spool", registry=r)
        self.uplink = UplinkMetrics(r)  # link-adaptive shaping (gateway/publish/uplink.py)
        self.spool_dropped = Counter(
            "mavjet_spool_dropped", "Spooled events dropped at the bound, by class (mavjet.gateway.publish.spool)", ["class"],
            registry=r,
        )
        self.events = Counter("mavjet_events", "Events detected", ["type"], registry=r)
        self.events_suppressed = Counter(
            "mavjet_events_suppressed", "Events held back by a vehicle's event budget (not published)", ["type"],
            registry=r,
        )
        self.commands = Counter("mavjet_commands", "Commands finished by result", ["command", "result"], registry=r)
        self.command_duration = Histogram(
            "mavjet_command_duration_seconds", "From a command's delivery to the gateway to its cmd_result",
            ["command", "result"], buckets=COMMAND_BUCKETS, registry=r,
        )
        # Where that time goes: `ledger` (the in-flight row's durable commit, an fsync) and `vehicle`
        # (the MAVLink exchange) for a command that is sent; `result` (the cmd_result recorded and
        # stored in JetStream) for every command that ends, a refused or expired one too (only that
        # phase). A tail in `ledger` is the disk, in `vehicle` the link. And before the gateway: `queue`,
        # from the command's `issued` stamp (the issuer's clock) to its delivery to the vehicle's loop, for
        # every command that decodes: the stream, the server and this process's event loop (a skew between
        # the issuer's clock and this one shifts it; a negative span counts as 0).
        self.command_phase = Histogram(
            "mavjet_command_phase_seconds",
            "A command's time by phase: queue (issued to delivered), then in the gateway ledger, vehicle, result",
            ["phase"], buckets=(0.001, 0.0025, 0.005, *COMMAND_BUCKETS), registry=r,
        )
        # How late a timer's wake-up comes (`Gateway._lag_probe`, every LAG_PROBE_S): the wait that every
        # hop of work through the event loop (a command's delivery, its ledger's answer, its COMMAND_ACK)
        # may add. A tail here lies in the process as a whole (long loop passes, or no CPU to run on).
        self.loop_lag = Histogram(
            "mavjet_event_loop_lag_seconds", "How late the event loop runs a timer that is due (a probe)",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5), registry=r,
        )
        self.loop_tick = Gauge(
            "mavjet_loop_last_tick_timestamp_seconds",
            "Unix time of the gateway's last publish tick (a stale value means a hung event loop)",
            registry=r,
        )

    def nats_error(self, exc: BaseException) -> None:
        """Count an error from the NATS client's error callback (all in `errors{where=nats}`, auth ones also apart)."""
        self.errors.labels(where="nats").inc()
        reason = nats_auth_reason(exc)
        if reason is not None:
            self.nats_auth_errors.labels(reason).inc()

    def watch_sessions(self, sessions: Callable[[], Iterable[Session]]) -> None:
        self.registry.watch_link(LinkMetrics(sessions))

    def watch_superseded(self, superseded: Callable[[], int]) -> None:
        """`superseded()` → the fleet's state samples replaced before their publish turn (`VehicleTwin.superseded`)."""
        self.registry.register(_SupersededCollector(superseded))

    def watch_signing(self, rejected: Callable[[], Iterable[tuple[str, Mapping[str, int]]]]) -> None:
        """`rejected()` → (vid, {reason: frames dropped}) per vehicle; empty for links without a key."""
        self.registry.register(_SigningCollector(rejected))

    def watch_ownership(self, status: Callable[[], OwnershipStatus]) -> None:
        """`status()` → the lease state of every vehicle, read at scrape time."""
        self.registry.register(_OwnershipCollector(status))

    def watch_routes(self, routes: Callable[[], Iterable[tuple[str, str, RouteStats]]]) -> None:
        """`routes()` → (vid, route, its counters) for every route and tunnel."""
        self.registry.register(_RouteCollector(routes))

    def serve(self, host: str, port: int) -> int:
        """Serve /metrics on a daemon thread; returns the bound port. A port in use is a ConfigError."""
        return serve_app(self.registry.wsgi_app(), host, port)

    def serve_on(self, sock: socket.socket) -> int:
        """Serve /metrics on an inherited listening socket (a `--workers` worker's); returns its port."""
        return serve_app_on(self.registry.wsgi_app(), sock)


# -- `--workers`: one /metrics for the supervisor and its workers ----------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerStatus:
    """What the supervisor knows of one worker when Prometheus scrapes it (gateway/runtime/workers.py)."""

    worker: str
    metrics_port: int
    running: bool
    ready: bool
    restarts: int
    vehicles: int


def merge_worker_metrics(texts: Iterable[tuple[str, str]]) -> list[Metric]:
    """Each worker's exposition text, parsed and relabelled with `worker`, one family per name.

    Families are merged so the output has one HELP/TYPE per name, as the
    exposition format requires; a family's samples keep their own names
    (`_total`, `_bucket`, `_sum`, ...).
    """
    families: dict[str, Metric] = {}
    for worker, text in texts:
        for fam in text_string_to_metric_families(text):
            merged = families.get(fam.name)
            if merged is None:
                merged = families[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            for s in fam.samples:
                merged.add_sample(s.name, {**s.labels, "worker": worker}, s.value, s.timestamp)
    return list(families.values())


class _WorkersCollector(Collector):
    """Scrapes each running worker's loopback /metrics at collect time (no copy kept, nothing stale served)."""

    def __init__(self, status: Callable[[], Iterable[WorkerStatus]], timeout_s: float) -> None:
        self._status = status
        self._timeout_s = timeout_s

    def collect(self) -> Iterator[Any]:
        up = GaugeMetricFamily("mavjet_worker_up", "1 while the worker process runs and answered this scrape",
                               labels=["worker"])
        ready = GaugeMetricFamily("mavjet_worker_ready", "1 once the worker reported READY (its links started)",
                                  labels=["worker"])
        restarts = CounterMetricFamily("mavjet_worker_restarts", "Times the supervisor restarted the worker",
                                       labels=["worker"])
        vehicles = GaugeMetricFamily("mavjet_worker_vehicles", "Vehicles in the worker's slice", labels=["worker"])
        texts: list[tuple[str, str]] = []
        for st in self._status():
            answered = False
            if st.running:
                try:
                    url = f"http://127.0.0.1:{st.metrics_port}/metrics"
                    with urllib.request.urlopen(url, timeout=self._timeout_s) as resp:
                        texts.append((st.worker, resp.read().decode()))
                    answered = True
                except (OSError, ValueError):  # starting, stopping or hung: worker_up says so
                    pass
            up.add_metric([st.worker], 1.0 if answered else 0.0)
            ready.add_metric([st.worker], 1.0 if st.ready else 0.0)
            restarts.add_metric([st.worker], st.restarts)
            vehicles.add_metric([st.worker], st.vehicles)
        yield from (up, ready, restarts, vehicles)
        yield from merge_worker_metrics(texts)


class WorkersMetrics:
    """The supervisor's registry: its own worker_* series and every worker's, labelled `worker`."""

    def __init__(self, status: Callable[[], Iterable[WorkerStatus]], *, scrape_timeout_s: float = 2.0) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in prometheus_client
        self.registry = CollectorRegistry()
        self.registry.register(_WorkersCollector(status, scrape_timeout_s))

    def serve(self, host: str, port: int) -> int:
        return serve_app(make_wsgi_app(self.registry), host, port)
