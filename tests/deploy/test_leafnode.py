"""Leaf-node catch-up: events recorded on a companion while its uplink is cut reach the hub by NATS itself.

Two real nats-servers on loopback: the hub, and the companion started from
deploy/companion/leaf.conf (its own JetStream domain) whose leaf connection
runs through a TCP proxy in this test. The companion's TWIN_EVENTS comes from
deploy/companion/jetstream/, the hub's from deploy/companion/hub-twin-events.json
(sourcing the companion's stream through `$JS.veh-VID-001.API`). Events are
published on the companion the whole time, the proxy cuts the link for
CUT_S seconds and restores it, and the hub's TWIN_EVENTS must then hold every
event exactly once and in publish order.

The cut lasts 30 s (CUT_S): the two-minute cut of the same mechanism (a leaf's
stream sourced across a cut uplink, `deny_exports` on the remote) runs in
tests/deploy/test_central_hubs.py with two hubs and a central cluster; this
test keeps the companion's own files (deploy/companion/) tested. It prints the
catch-up time: from restoring the link to the hub holding every event.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client

from mavjet.contract.natsconn import open_client
from mavjet.ops.natsserver import NatsServer, free_port
from mavjet.ops.provision import DEFINITIONS_DIR, load_definitions, provision

ROOT = Path(__file__).resolve().parents[2]
COMPANION = ROOT / "deploy/companion"
CUT_S = 30.0  # two minutes: tests/deploy/test_central_hubs.py (see the docstring)
PERIOD_S = 0.05  # 20 events a second, a flying vehicle's busy event rate
MAX_EVENTS = int((CUT_S + 120.0) / PERIOD_S)  # bounds the publishing loop whatever happens
SUBJECT = "fleet.test.veh.VID-001.evt.waypoint_reached"


class Proxy:
    """A TCP relay whose link can be cut (connections aborted, port closed) and restored."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def cut(self) -> None:
        assert self.server is not None
        self.server.close()
        for w in self.writers:
            w.transport.abort()
        self.writers.clear()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.server = None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self.writers |= {writer, up_w}
        for src, dst in ((reader, up_w), (up_r, writer)):
            t = asyncio.ensure_future(self._pump(src, dst))
            self.tasks.add(t)
            t.add_done_callback(self.tasks.discard)

    @staticmethod
    async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            dst.transport.abort()


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[tuple[NatsServer, int]]:
    leaf_port = free_port()
    conf = tmp_path / "hub.conf"
    # The hub: any JetStream server with a leafnodes listener (deploy/nats/single.conf has one).
    # no_advertise: else the hub tells the leaf its own leafnode address and the
    # leaf reconnects there directly, around the proxy this test cuts.
    conf.write_text(f"server_name: hub\njetstream {{ max_file_store: 1TB }}\n"
                    f"leafnodes {{ listen: 127.0.0.1:{leaf_port}, no_advertise: true }}\n")
    srv = NatsServer(config_file=str(conf), store_dir=str(tmp_path / "hub-js"), log_file=str(tmp_path / "hub.log"))
    with srv:
        yield srv, leaf_port


def companion_config(proxy_port: int) -> str:
    text = (COMPANION / "leaf.conf").read_text()
    text, n = re.subn(r"nats-leaf://hub\.example\.net:7422", f"nats-leaf://127.0.0.1:{proxy_port}", text)
    assert n == 1
    text, n = re.subn(r'^\s*credentials:.*$', "", text, flags=re.M)  # the test hub has no auth
    assert n == 1
    # NatsServer passes the store (-sd) and the port (-p) itself.
    return text.replace('store_dir: "jetstream"', "").replace("reconnect: 2s", "reconnect: 1s")


@pytest.fixture
async def proxy(hub: tuple[NatsServer, int]) -> AsyncIterator[Proxy]:
    p = Proxy(hub[1])
    await p.start()
    try:
        yield p
    finally:
        if p.server is not None:
            await p.cut()


@pytest.fixture
def leaf(tmp_path: Path, proxy: Proxy) -> Iterator[NatsServer]:
    conf = tmp_path / "leaf.conf"
    conf.write_text(companion_config(proxy.port))
    srv = NatsServer(config_file=str(conf), store_dir=str(tmp_path / "leaf-js"), log_file=str(tmp_path / "leaf.log"))
    with srv:
        yield srv


async def hub_events(js: nats.js.JetStreamContext) -> list[int]:
    info = await js.stream_info("TWIN_EVENTS")
    out: list[int] = []
    seq = info.state.first_seq
    for _ in range(info.state.messages):
        m = await js.get_msg("TWIN_EVENTS", seq=seq, subject="fleet.test.veh.*.evt.>", next=True)
        out.append(json.loads(m.data or b"{}")["i"])
        seq = (m.seq or 0) + 1
    return out


async def wait_for(pred: Callable[[], Awaitable[bool]], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for _ in range(int(timeout_s / 0.2) + 1):
        if time.monotonic() >= deadline:
            break
        if await pred():
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"not within {timeout_s}s")


@pytest.mark.waits  # two minutes of a cut link: `make test` runs it beside the rest
@pytest.mark.timeout(int(CUT_S) + 240)
async def test_events_recorded_during_an_uplink_cut_reach_the_hub_once_and_in_order(
    hub: tuple[NatsServer, int], proxy: Proxy, leaf: NatsServer,
) -> None:
    flying: asyncio.Future[None] | None = None
    hub_nc: Client = await open_client(hub[0].url, connect_timeout=2)
    leaf_nc: Client = await open_client(leaf.url, connect_timeout=2)
    try:
        hub_js, leaf_js = hub_nc.jetstream(), leaf_nc.jetstream()
        # The companion: its own TWIN_EVENTS in its own domain (what `mavjet provision
        # --definitions deploy/companion/jetstream` makes there).
        await provision(leaf_js, load_definitions(COMPANION / "jetstream", env="test", replicas=1))
        # The hub: TWIN_EVENTS as provisioned, then given its source (what
        # `nats stream edit TWIN_EVENTS --config deploy/companion/hub-twin-events.json` does).
        hub_defs = [d for d in load_definitions(DEFINITIONS_DIR, env="test", replicas=1) if d.name == "TWIN_EVENTS"]
        await provision(hub_js, hub_defs)
        config = json.loads((COMPANION / "hub-twin-events.json").read_text().replace("fleet.prod.", "fleet.test."))
        resp = await hub_nc.request("$JS.API.STREAM.UPDATE.TWIN_EVENTS", json.dumps(config).encode(), timeout=5)
        assert "error" not in json.loads(resp.data), resp.data
        # Provisioning again leaves the stream, and so its source, alone.
        assert [a.verb for a in await provision(hub_js, hub_defs)] == ["unchanged"]

        sent: list[int] = []

        async def fly(stop: asyncio.Event) -> None:
            i = 0
            while not stop.is_set() and i < MAX_EVENTS:
                ack = await leaf_js.publish(SUBJECT, json.dumps({"i": i}).encode(), headers={"Nats-Msg-Id": f"VID-001-{i}"})
                assert ack.domain == "veh-VID-001" and ack.stream == "TWIN_EVENTS"  # the local stream took it
                sent.append(i)
                i += 1
                await asyncio.sleep(PERIOD_S)

        stop = asyncio.Event()
        flying = asyncio.ensure_future(fly(stop))
        # Linked: events flow to the hub through the source.
        await wait_for(lambda: _count_at_least(hub_js, 20), 30)
        await proxy.cut()
        cut_at = len(sent)
        await asyncio.sleep(2.0)  # what was in flight settles
        during_before = (await hub_js.stream_info("TWIN_EVENTS")).state.messages
        await asyncio.sleep(CUT_S - 2.0)
        during_after = (await hub_js.stream_info("TWIN_EVENTS")).state.messages
        assert during_after == during_before, "the hub received events while the uplink was cut"
        assert len(sent) - cut_at >= 0.5 * CUT_S / PERIOD_S  # the vehicle kept recording meanwhile
        await proxy.start()
        restored = time.monotonic()
        await asyncio.sleep(3.0)  # and keeps recording after the link returns
        stop.set()
        await flying
        total = len(sent)
        await wait_for(lambda: _count_at_least(hub_js, total), 90)
        print(f"leaf catch-up: {total - cut_at} events recorded since the cut reached the hub "
              f"{time.monotonic() - restored:.1f} s after the link returned (publishing went on for 3 s of it)")
        await asyncio.sleep(1.0)  # nothing more arrives: no duplicates still on their way
        got = await hub_events(hub_js)
        assert got == list(range(total)), f"{len(got)} events, first difference at {_first_diff(got, total)}"
        assert (await hub_js.stream_info("TWIN_EVENTS")).state.messages == total
    finally:
        if flying is not None and not flying.done():
            flying.cancel()
            await asyncio.gather(flying, return_exceptions=True)
        await leaf_nc.close()
        await hub_nc.close()


async def _count_at_least(js: nats.js.JetStreamContext, n: int) -> bool:
    return bool((await js.stream_info("TWIN_EVENTS")).state.messages >= n)


def _first_diff(got: list[int], total: int) -> int | None:
    return next((k for k, (a, b) in enumerate(zip(got, range(total), strict=False)) if a != b), None)
