"""Per-vehicle link metrics, and a /metrics page that formats them itself.

At 1,000 vehicles the link families are 6,000 of a page's ~6,100 series.
prometheus_client builds a `Sample` per series and formats each one in
Python on the metrics thread, while the event loop waits for the GIL: a
page took 33 ms to build (text format) or 66 ms (OpenMetrics, what
Prometheus asks for first), uncontended; under load a scrape took 55-190 ms
and held commands up behind it (docs/benchmarks.md). Here each vehicle's
row is read once (`Session.health()`) and formatted with one string
operation per series; the rest of the page is still prometheus_client's.
In-process readers (`registry.get_sample_value`, `generate_latest`) still
get real metric families from `LinkMetrics.families()`, and a test holds
both renderings to the same bytes in both formats.
"""

from __future__ import annotations

import gzip
import math
from collections.abc import Callable, Container, Iterable, Iterator
from typing import Any
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from mavjet.drivers.mavlink.link import LinkState
from mavjet.drivers.mavlink.session import Session

# (name, type, help) in page order; BY_TYPE is the fleet's family, labelled `type` instead of `vid`.
BY_TYPE = "mavjet_mavlink_messages_by_type"
FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("mavjet_mavlink_messages", "counter", "MAVLink messages received, per vehicle"),
    (BY_TYPE, "counter", "MAVLink messages received by the gateway's fleet, per message type"),
    ("mavjet_mavlink_crc_errors", "counter", "MAVLink frames with a bad CRC"),
    ("mavjet_mavlink_bad_data_runs", "counter",
     "Stretches of bytes that were not a valid frame (unknown ids included); runs, not bytes"),
    ("mavjet_mavlink_lost_frames", "counter", "MAVLink frames missing by sequence number"),
    ("mavjet_link_up", "gauge", "1 while heartbeats arrive from the vehicle"),
    ("mavjet_heartbeat_age_seconds", "gauge", "Seconds since the last vehicle heartbeat"),
)
# Where each per-vehicle family's value stands in a row (BY_TYPE has none).
_COLUMN = {name: i for i, name in enumerate(name for name, _, _ in FAMILIES if name != BY_TYPE)}
_OM_EOF = b"# EOF\n"

Row = tuple[str, tuple[float, ...]]  # (vid, the per-vehicle families' values in FAMILIES order, BY_TYPE left out)
WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


_go_float: Callable[[float], str] = floatToGoString  # how prometheus_client writes a value (NaN, +Inf, 1.5e+07)


def _number(v: float) -> str:
    """`floatToGoString`, with the common case (a counter below a million: `n.0`) in one step."""
    if type(v) is int and 0 <= v < 1_000_000:
        return f"{v}.0"
    return _go_float(v)


def _label_value(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


class LinkMetrics:
    """The link families of every session, read at scrape time (the codec counts; nothing per message here)."""

    def __init__(self, sessions: Callable[[], Iterable[Session]]) -> None:
        self._sessions = sessions

    def _snapshot(self) -> tuple[list[Row], dict[str, int]]:
        rows: list[Row] = []
        fleet: dict[str, int] = {}
        for session in self._sessions():
            h = session.health()
            for t, n in list(h.by_type.items()):
                fleet[t] = fleet.get(t, 0) + n
            age = math.nan if h.heartbeat_age_s is None else h.heartbeat_age_s
            # messages_in: the same frames by_type counts, summed by the framer
            rows.append((session.name, (h.messages_in, h.crc_errors, h.bad_data, h.seq_gaps,
                                        1.0 if h.state is LinkState.UP else 0.0, age)))
        return rows, fleet

    def families(self) -> Iterator[Metric]:
        """The families as prometheus_client objects: for in-process readers, and the reference for `text`."""
        rows, fleet = self._snapshot()
        for name, kind, doc in FAMILIES:
            labels = ["type"] if name == BY_TYPE else ["vid"]
            fam = CounterMetricFamily(name, doc, labels=labels) if kind == "counter" else \
                GaugeMetricFamily(name, doc, labels=labels)
            if name == BY_TYPE:
                for t, n in sorted(fleet.items()):
                    fam.add_metric([t], n)
            else:
                column = _COLUMN[name]
                for vid, values in rows:
                    fam.add_metric([vid], values[column])
            yield fam

    def text(self, *, openmetrics: bool, names: Container[str] | None = None) -> str:
        """The families as exposition text, the same bytes prometheus_client would write for `families()`."""
        rows, fleet = self._snapshot()
        out: list[str] = []
        labels: list[str] | None = None
        for name, kind, doc in FAMILIES:
            sample = f"{name}_total" if kind == "counter" else name
            if names is None or name in names or sample in names:
                header = name if openmetrics else sample
                out.append(f"# HELP {header} {doc}\n# TYPE {header} {kind}\n")
                if name == BY_TYPE:
                    out.extend(f'{sample}{{type="{_label_value(t)}"}} {_number(n)}\n'
                               for t, n in sorted(fleet.items()))
                else:
                    if labels is None:  # once a scrape, not once a series
                        labels = [f'{{vid="{_label_value(vid)}"}} ' for vid, _ in rows]
                    column = _COLUMN[name]
                    out.extend(f"{sample}{label}{_number(values[column])}\n"
                               for label, (_, values) in zip(labels, rows, strict=True))
        return "".join(out)


class _Own(Collector):
    """A registry's collectors, the link families' left out: what the page asks prometheus_client to format."""

    def __init__(self, registry: GatewayRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        yield from CollectorRegistry.collect(self._registry)


class GatewayRegistry(CollectorRegistry):
    """A registry whose link families (`watch_link`) are formatted by `LinkMetrics.text` when served."""

    def __init__(self) -> None:
        super().__init__()
        self.link: LinkMetrics | None = None

    def watch_link(self, link: LinkMetrics) -> None:
        self.link = link

    def collect(self) -> Iterator[Metric]:
        yield from super().collect()
        if self.link is not None:
            yield from self.link.families()

    def wsgi_app(self) -> WSGIApp:
        """prometheus_client's /metrics app, with the link families appended as `LinkMetrics.text` writes them."""
        own = _Own(self)
        prom: WSGIApp = make_wsgi_app(own)

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            link = self.link
            if link is None or environ["REQUEST_METHOD"] != "GET" or environ.get("PATH_INFO") == "/favicon.ico":
                return prom(environ, start_response)  # OPTIONS, 405, the favicon, a page without links
            encoder, content_type = choose_encoder(environ.get("HTTP_ACCEPT", ""))
            names = parse_qs(environ.get("QUERY_STRING", "")).get("name[]")
            body = encoder(self.restricted_registry(names) if names else own)
            links = link.text(openmetrics=content_type.startswith("application/openmetrics-text"),
                              names=set(names) if names else None).encode()
            body = body[:-len(_OM_EOF)] + links + _OM_EOF if body.endswith(_OM_EOF) else body + links
            headers = [("Content-Type", content_type)]
            if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
                body = gzip.compress(body)
                headers.append(("Content-Encoding", "gzip"))
            start_response("200 OK", headers)
            return [body]

        return app
