"""The link families written by hand (gateway/runtime/linkmetrics.py) are byte for byte what prometheus_client writes."""

from __future__ import annotations

import gzip
import urllib.request
from collections.abc import Iterator, Mapping

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from mavjet.drivers.mavlink.link import LinkState
from mavjet.drivers.mavlink.session import LinkHealth
from mavjet.gateway.runtime.linkmetrics import LinkMetrics
from mavjet.gateway.runtime.metrics import GatewayMetrics


class _Vehicle:
    """What the families read of a session: its name and its counters (a live session is tested in
    tests/gateway/test_telemetry_twin.py)."""

    def __init__(self, name: str, *, up: bool, n: int, age_s: float | None, by_type: Mapping[str, int]) -> None:
        self.name = name
        self._h = LinkHealth(state=LinkState.UP if up else LinkState.LOST, endpoint="udp:127.0.0.1:14550",
                             messages_in=n, crc_errors=n // 1000, bad_data=3, seq_gaps=n // 7, connects=1,
                             heartbeat_age_s=age_s, by_type=by_type)

    def health(self) -> LinkHealth:
        return self._h


FLEET = [
    _Vehicle("VID-001", up=True, n=123_456, age_s=0.25, by_type={"HEARTBEAT": 10, "ATTITUDE": 100}),
    _Vehicle("VID-002", up=False, n=15_000_000, age_s=None, by_type={"HEARTBEAT": 3}),  # 1.5e+07; NaN age
    _Vehicle('odd "name"\\with\nall', up=True, n=0, age_s=1e-9, by_type={}),  # every escape a label value has
    _Vehicle("VID-004", up=True, n=999_999, age_s=2.0, by_type={"HEARTBEAT": 999_999}),  # the last plain count
    _Vehicle("VID-005", up=True, n=7_000_000, age_s=0.0, by_type={}),  # 7e+06, and 1e+06 frames lost
]


class _Families(Collector):
    def __init__(self, link: LinkMetrics) -> None:
        self._link = link

    def collect(self) -> Iterator[Metric]:
        return self._link.families()


@pytest.mark.parametrize("fleet", [FLEET, []], ids=["three", "none"])
def test_text_is_what_prometheus_client_writes(fleet: list[_Vehicle]) -> None:
    link = LinkMetrics(lambda: fleet)  # type: ignore[arg-type,return-value]  # name and health() are all it reads
    reference = CollectorRegistry()
    reference.register(_Families(link))
    assert link.text(openmetrics=False).encode() == generate_latest(reference)
    assert link.text(openmetrics=True).encode() + b"# EOF\n" == generate_openmetrics(reference)


def test_names_pick_families() -> None:
    link = LinkMetrics(lambda: FLEET)  # type: ignore[arg-type,return-value]
    text = link.text(openmetrics=False, names={"mavjet_link_up", "mavjet_mavlink_messages_total"})
    fams = {f.name for f in text_string_to_metric_families(text)}
    assert fams == {"mavjet_link_up", "mavjet_mavlink_messages"}


def _get(url: str, accept: str, *, gz: bool = False) -> tuple[str, str]:
    req = urllib.request.Request(url, headers={"Accept": accept, **({"Accept-Encoding": "gzip"} if gz else {})})
    with urllib.request.urlopen(req, timeout=10) as resp:
        body = resp.read()
        if resp.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        return resp.headers["Content-Type"], body.decode()


def test_the_served_page_holds_both_halves_in_either_format() -> None:
    gm = GatewayMetrics()
    gm.watch_sessions(lambda: FLEET)  # type: ignore[arg-type,return-value]
    gm.publishes.labels(kind="state", result="acked").inc(5)
    port = gm.serve("127.0.0.1", 0)
    url = f"http://127.0.0.1:{port}/metrics"

    ctype, text = _get(url, "text/plain", gz=True)
    assert ctype.startswith("text/plain")
    plain = {f.name: f for f in text_string_to_metric_families(text)}
    assert plain["mavjet_publishes"].samples[0].value == 5.0
    ups = {s.labels["vid"]: s.value for s in plain["mavjet_link_up"].samples}
    assert ups == {"VID-001": 1.0, "VID-002": 0.0, 'odd "name"\\with\nall': 1.0, "VID-004": 1.0, "VID-005": 1.0}
    assert text.count("# TYPE mavjet_link_up gauge") == 1  # served once, not by both halves

    ctype, text = _get(url, "application/openmetrics-text;version=1.0.0,text/plain;q=0.5")
    assert ctype.startswith("application/openmetrics-text")
    assert text.endswith("# EOF\n") and text.count("# EOF") == 1
    om = {f.name: f for f in parse_openmetrics(text)}  # the strict parser: one EOF, at the end
    assert {s.labels["type"]: s.value for s in om["mavjet_mavlink_messages_by_type"].samples} == \
        {"HEARTBEAT": 1_000_012.0, "ATTITUDE": 100.0}
    assert om["mavjet_publishes"].samples[0].value == 5.0

    _, text = _get(f"{url}?name[]=mavjet_link_up", "text/plain")
    assert {f.name for f in text_string_to_metric_families(text)} == {"mavjet_link_up"}
    # In-process readers see the link families as well.
    assert gm.registry.get_sample_value("mavjet_mavlink_messages_total", {"vid": "VID-002"}) == 15_000_000.0
