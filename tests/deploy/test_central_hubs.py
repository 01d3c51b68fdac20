"""A central cluster over two leaf hubs, all real: the topology of docs/deploy.md, "Central cluster over leaf hubs".

Five nats-servers on loopback: a 3-node R3 central cluster from
deploy/central/centre-common.conf, and two edge hubs from
deploy/central/hub-{a,b}.conf, each its own JetStream domain, joined as leaf
nodes through a TCP proxy each (test_leafnode.py's) so a hub's uplink can be
cut. Each hub is provisioned as any hub (plus TWIN_DIGEST) and runs its own
gateway in process with two simulated vehicles; the centre's TWIN_EVENTS,
TWIN_TRACKS and TWIN_STATE are deploy/central/centre/*.json, sourcing both
hubs. One vehicle per hub flies (its track), and commands at each hub keep
events coming the whole time.

It checks: a command issued at the centre runs on hub-b's vehicle and its one
`cmd_result` comes back to the issuer and into the centre's stream; the
centre's state digest holds every vehicle at about the configured rate; while
hub-a's uplink is cut (CUT_S, two minutes as the issue asks;
MAVJET_CENTRAL_CUT_S shortens it for a local run) the centre takes nothing of
hub-a and keeps taking hub-b; afterwards the centre holds each hub's events
and track samples exactly once and in the hub's order, vehicle by vehicle;
`mavjet fleet` at the centre lists the four vehicles with their hub; and the
replay's event reader (the Spark source's, analytics/natsread.py) at the
centre sees both hubs' flights.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
import os
import re
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import api as jsapi

from mavjet.analytics.columns import BASE_COLUMNS
from mavjet.analytics.natsread import iter_range
from mavjet.analytics.options import SourceOptions
from mavjet.contract import envelope
from mavjet.contract.natsconn import open_client
from mavjet.gateway.config import GatewayConfig
from mavjet.gateway.daemon import Gateway, with_services
from mavjet.gateway.publish.digest import DigestConfig
from mavjet.ops.client import CommandClient
from mavjet.ops.fleet import snapshot
from mavjet.ops.natsserver import NatsServer, free_port
from mavjet.ops.provision import DEFINITIONS_DIR, load_definitions, provision
from mavjet.sim.fleet import SimConfig, SimFleet
from tests.deploy.test_leafnode import Proxy
from tests.support import gateway_config, running
from tests.support.cluster import wait_jetstream_ready
from tests.support.commands import ready_to_fly

ROOT = Path(__file__).resolve().parents[2]
CENTRAL = ROOT / "deploy/central"
ENV = "test"
CUT_S = float(os.environ.get("MAVJET_CENTRAL_CUT_S", "120"))  # the issue's two-minute cut
DIGEST_HZ = 0.5  # the test's digest rate ([digest] hz; the example config says 0.2)
CMD_EVERY_S = 4.0  # a command at each hub this often: events the whole time
HUBS = {"hub-a": ("VID-001", "VID-002"), "hub-b": ("VID-003", "VID-004")}
FLYING = {"hub-a": "VID-001", "hub-b": "VID-003"}
CATCH_UP_S = 150.0  # the centre re-creates a source a minute or so after a long cut (docs/companion.md)


def centre_config(name: str, cluster_port: int, route_ports: list[int], leaf_port: int) -> str:
    """deploy/central/centre-common.conf for loopback: ports of this test, the store and port from NatsServer."""
    text = (CENTRAL / "centre-common.conf").read_text()
    routes = "\n".join(f'    "nats://127.0.0.1:{p}"' for p in route_ports)
    text, n = re.subn(r"routes: \[[^\]]*\]", "routes: [\n" + routes + "\n  ]", text)
    assert n == 1
    for old, new in (("listen: 0.0.0.0:4222\n", ""), ("http: 127.0.0.1:8222\n", ""), ('store_dir: "jetstream"', ""),
                     ("max_file_store: 300GB", "max_file_store: 1TB"),
                     ("listen: 0.0.0.0:6222", f"listen: 127.0.0.1:{cluster_port}"),
                     # no_advertise: else a hub learns the other nodes' leaf ports and reconnects around its proxy.
                     ("listen: 0.0.0.0:7422", f"listen: 127.0.0.1:{leaf_port}, no_advertise: true")):
        assert old in text, old
        text = text.replace(old, new)
    return f"server_name: {name}\n" + text


def hub_config(hub: str, proxy_port: int) -> str:
    """deploy/central/hub-X.conf for loopback: its uplink through the test's proxy, no credentials (no auth here)."""
    text = (CENTRAL / f"{hub}.conf").read_text()
    text, n = re.subn(r"urls: \[[^\]]*\]", f'urls: ["nats-leaf://127.0.0.1:{proxy_port}"]', text)
    assert n == 1
    text, n = re.subn(r"^\s*credentials:.*$", "", text, flags=re.M)
    assert n == 1
    for old, new in (("listen: 0.0.0.0:4222\n", ""), ("http: 127.0.0.1:8222\n", ""), ('store_dir: "jetstream"', ""),
                     ("max_file_store: 200GB", "max_file_store: 1TB"), ("listen: 0.0.0.0:7422", "listen: 127.0.0.1:-1"),
                     ("reconnect: 2s", "reconnect: 1s")):
        assert old in text, old
        text = text.replace(old, new)
    return text


@dataclasses.dataclass
class Topology:
    centre: list[NatsServer]
    hubs: dict[str, NatsServer]
    proxies: dict[str, Proxy]


@pytest.fixture
def centre(tmp_path: Path) -> Iterator[tuple[list[NatsServer], list[int]]]:
    names = ["centre-1", "centre-2", "centre-3"]
    cluster_ports = [free_port() for _ in names]
    leaf_ports = [free_port() for _ in names]
    nodes: list[NatsServer] = []
    for i, name in enumerate(names):
        d = tmp_path / name
        d.mkdir()
        (d / "node.conf").write_text(centre_config(name, cluster_ports[i], cluster_ports, leaf_ports[i]))
        nodes.append(NatsServer(store_dir=str(d / "js"), config_file=str(d / "node.conf"),
                                log_file=str(d / "nats.log"), ready_timeout_s=30.0))
    try:
        for node in nodes:
            node.start()
        yield nodes, leaf_ports
    finally:
        for node in nodes:
            node.cleanup()


@pytest.fixture
async def topology(tmp_path: Path, centre: tuple[list[NatsServer], list[int]]) -> AsyncIterator[Topology]:
    nodes, leaf_ports = centre
    # hub-a's uplink lands on centre-1, hub-b's on centre-2: the sources cross the cluster's routes.
    proxies = {hub: Proxy(leaf_ports[i]) for i, hub in enumerate(HUBS)}
    hubs: dict[str, NatsServer] = {}
    try:
        for hub, proxy in proxies.items():
            await proxy.start()
            (tmp_path / f"{hub}.conf").write_text(hub_config(hub, proxy.port))
            hubs[hub] = NatsServer(config_file=str(tmp_path / f"{hub}.conf"), store_dir=str(tmp_path / f"{hub}-js"),
                                   log_file=str(tmp_path / f"{hub}.log")).start()
        yield Topology(centre=nodes, hubs=hubs, proxies=proxies)
    finally:
        for srv in hubs.values():
            srv.cleanup()
        for proxy in proxies.values():
            if proxy.server is not None:
                await proxy.cut()


async def provision_all(top: Topology, centre_nc: Client) -> None:
    for srv in top.hubs.values():
        nc = await open_client(srv.url, connect_timeout=2)
        try:
            js = nc.jetstream()
            await provision(js, load_definitions(DEFINITIONS_DIR, env=ENV, replicas=1, size="small"))
            await provision(js, load_definitions(CENTRAL / "hub/jetstream", env=ENV, replicas=1))
        finally:
            await nc.close()
    # What `nats stream add --config deploy/central/centre/<stream>.json` does at the centre.
    for path in sorted((CENTRAL / "centre").glob("*.json")):
        config = json.loads(path.read_text().replace("fleet.prod.", f"fleet.{ENV}."))
        assert config["num_replicas"] == 3
        resp = json.loads((await centre_nc.request(f"$JS.API.STREAM.CREATE.{config['name']}",
                                                   json.dumps(config).encode(), timeout=10)).data)
        assert "error" not in resp, (path.name, resp)


def hub_gateway(hub: str, url: str, endpoints: list[str], state_dir: Path) -> Gateway:
    base = gateway_config(url, endpoints, state_dir, track_hz=2.0, digest=DigestConfig(hz=DIGEST_HZ))
    vehicles = tuple(dataclasses.replace(v, vid=vid) for v, vid in zip(base.vehicles, HUBS[hub], strict=True))
    cfg: GatewayConfig = dataclasses.replace(base, vehicles=vehicles, instance=f"gw-{hub}")
    return with_services(Gateway(cfg), commands=True, shadow=False)


async def on_subject(nc: Client, stream: str, subject: str) -> int:
    """How many messages `stream` holds on `subject` (a filter)."""
    info = await nc.jetstream().stream_info(stream, subjects_filter=subject)
    return sum((info.state.subjects or {}).values())


async def ids_in_order(nc: Client, stream: str, subject: str) -> list[str]:
    """The `Nats-Msg-Id` of every message of `stream` on `subject`, in stream order (bounded by its count)."""
    n = await on_subject(nc, stream, subject)
    out: list[str] = []
    if not n:
        return out
    sub = await nc.jetstream().subscribe(subject, ordered_consumer=True,
                                         config=jsapi.ConsumerConfig(deliver_policy=jsapi.DeliverPolicy.ALL))
    try:
        for _ in range(n):
            msg = await sub.next_msg(timeout=5.0)
            out.append((msg.headers or {}).get("Nats-Msg-Id", ""))
    finally:
        await sub.unsubscribe()
    return out


def per_vehicle(kind: str, vid: str) -> tuple[str, str]:
    if kind == "events":
        return "TWIN_EVENTS", f"fleet.{ENV}.veh.{vid}.evt.>"
    return "TWIN_TRACKS", f"fleet.{ENV}.veh.{vid}.track"


async def count(nc: Client, kind: str, vids: tuple[str, ...]) -> int:
    total = 0
    for vid in vids:
        total += await on_subject(nc, *per_vehicle(kind, vid))
    return total


async def until(what: str, pred: Callable[[], Awaitable[bool]], timeout_s: float, every_s: float = 0.5) -> float:
    """Poll `pred` (bounded in time and count); returns how long it took."""
    start = time.monotonic()
    for _ in range(int(timeout_s / every_s) + 1):
        if await pred():
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            break
        await asyncio.sleep(every_s)
    raise AssertionError(f"{what}: not within {timeout_s:g} s")


async def fly(client: CommandClient, vid: str) -> None:
    for name, params in (("set_mode", {"mode": "GUIDED"}), ("arm", {}), ("takeoff", {"alt_m": 10.0})):
        r = await client.call(vid, name, params, timeout_s=20.0)
        assert r.accepted, r


async def keep_commanding(clients: dict[str, CommandClient], stop: asyncio.Event, results: Counter[str]) -> None:
    """A mode change on each hub's grounded vehicle every CMD_EVERY_S, at the hub itself: events all along."""
    modes = ("LOITER", "GUIDED")
    for i in range(int(4 * (CUT_S + CATCH_UP_S) / CMD_EVERY_S) + 10):  # bounded whatever happens
        if stop.is_set():
            return
        for hub, client in clients.items():
            r = await client.call(HUBS[hub][1], "set_mode", {"mode": modes[i % 2]}, timeout_s=15.0)
            results[r.result] += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), CMD_EVERY_S)


async def digest_rates(nc: Client, window_s: float, vids: tuple[str, ...]) -> dict[str, int]:
    """How many `status` digests of each vehicle reach the centre's TWIN_STATE in `window_s`."""
    seen: Counter[str] = Counter()

    async def on_msg(msg: Msg) -> None:
        seen[msg.subject.split(".")[3]] += 1

    sub = await nc.jetstream().subscribe(
        f"fleet.{ENV}.veh.*.state.status", cb=on_msg, ordered_consumer=True,
        config=jsapi.ConsumerConfig(deliver_policy=jsapi.DeliverPolicy.NEW))
    try:
        await asyncio.sleep(window_s)
    finally:
        await sub.unsubscribe()
    return {vid: seen[vid] for vid in vids}


def replay_rows(url: str, last_seq: int) -> list[tuple[str, str]]:
    """(vid, type) of every event the replay's reader takes from the centre's TWIN_EVENTS."""
    names = [n for n, _ in BASE_COLUMNS]
    vid_i, type_i = names.index("vid"), names.index("type")
    rows: list[tuple[str, str]] = []
    for batch in iter_range(SourceOptions(url=url, stream="TWIN_EVENTS", data=False), 1, last_seq):
        rows += zip(batch[vid_i], batch[type_i], strict=True)
    return rows


@pytest.mark.waits  # two minutes of a cut uplink: `make test` runs it beside the rest
@pytest.mark.timeout(int(CUT_S + CATCH_UP_S) + 300)
async def test_a_central_cluster_over_two_leaf_hubs(topology: Topology, tmp_path: Path) -> None:
    t0 = time.monotonic()
    centre_nc = await open_client(servers=[n.url for n in topology.centre], connect_timeout=2,
                                  reconnect_time_wait=0.2, max_reconnect_attempts=-1)
    hub_nc = {hub: await open_client(srv.url, connect_timeout=2) for hub, srv in topology.hubs.items()}
    stop = asyncio.Event()
    commanding: asyncio.Future[None] | None = None
    try:
        await wait_jetstream_ready(centre_nc)
        await provision_all(topology, centre_nc)
        live_at_centre: list[str] = []

        async def on_live(msg: Msg) -> None:
            live_at_centre.append(msg.subject)

        # Nothing of a hub's events crosses its uplink live (its leaf remote denies them both ways).
        await centre_nc.subscribe(f"fleet.{ENV}.veh.*.evt.>", cb=on_live)
        async with contextlib.AsyncExitStack() as stack:
            gws: dict[str, Gateway] = {}
            fleets: dict[str, SimFleet] = {}
            for hub, srv in topology.hubs.items():
                fleets[hub] = await stack.enter_async_context(SimFleet(SimConfig(vehicles=2, base_port=0, speedup=2.0)))
                gws[hub] = await stack.enter_async_context(
                    running(hub_gateway(hub, srv.url, fleets[hub].endpoints, tmp_path / hub)))
            local = {hub: await stack.enter_async_context(CommandClient(nc, ENV, issuer=f"{hub}-ops"))
                     for hub, nc in hub_nc.items()}
            at_centre = await stack.enter_async_context(CommandClient(centre_nc, ENV, issuer="centre-ops",
                                                                      results_from_stream=True))
            for f in fleets.values():
                await ready_to_fly(f, timeout_s=60)
            for hub, vid in FLYING.items():
                await fly(local[hub], vid)

            # A command issued at the centre runs on hub-b's vehicle; its result comes back to the issuer.
            r = await at_centre.call("VID-004", "set_mode", {"mode": "LOITER"}, timeout_s=20.0)
            assert r.accepted, r
            await until("VID-004 in LOITER", _sync(lambda: fleets["hub-b"].vehicles[1].mode == "LOITER"), 10)
            centre_cmd = r.cmd_id
            # The same from the operator's CLI at the centre.
            cli = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "mavjet.ops", "cmd", "VID-003", "param_get", "-p", "name=RTL_ALT", "--central",
                "--wait", "--timeout", "20s", "--json", "--nats", topology.centre[0].url, "--env", ENV,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(cli.communicate(), 60)
            assert cli.returncode == 0, err.decode()[-2000:]
            assert json.loads(out)["result"] == "accepted", out

            # The digest at the centre: every vehicle of both hubs, at about DIGEST_HZ.
            window_s = 10.0
            rates = await digest_rates(centre_nc, window_s, (*HUBS["hub-a"], *HUBS["hub-b"]))
            assert all(abs(n - window_s * DIGEST_HZ) <= 2 for n in rates.values()), rates
            print(f"central hubs: digests of status in {window_s:g} s at {DIGEST_HZ} Hz: {rates}")

            # `mavjet fleet` at the centre: every vehicle of both hubs, live, with its hub (from the digest's
            # link record). Its staleness rule there: a few digest periods (docs/deploy.md).
            view = (await snapshot(centre_nc, ENV, stale_after_s=4 / DIGEST_HZ)).to_json(dt.datetime.now(dt.UTC))
            rows: Any = view["vehicles"]
            assert {v["vid"]: (v["hub"], v["stale"]) for v in rows} == \
                {vid: (hub, False) for hub, vids in HUBS.items() for vid in vids}, view

            # Events all along, from commands at each hub; both flying vehicles record their tracks.
            cmd_results: Counter[str] = Counter()
            commanding = asyncio.ensure_future(keep_commanding(local, stop, cmd_results))
            await until("hub-a's events and track at the centre",
                        lambda: _all_positive(centre_nc, ("VID-001", "VID-002")), 60)

            # hub-a's uplink is cut: the centre takes nothing more of hub-a, and keeps taking hub-b.
            await topology.proxies["hub-a"].cut()
            await asyncio.sleep(2.0)  # what was in flight settles
            frozen = (await count(centre_nc, "events", HUBS["hub-a"]), await count(centre_nc, "tracks", HUBS["hub-a"]))
            b_before = await count(centre_nc, "tracks", HUBS["hub-b"])
            a_local_before = await count(hub_nc["hub-a"], "events", HUBS["hub-a"])
            b_rates = await digest_rates(centre_nc, CUT_S - 2.0, HUBS["hub-b"])
            assert (await count(centre_nc, "events", HUBS["hub-a"]),
                    await count(centre_nc, "tracks", HUBS["hub-a"])) == frozen, "the centre took hub-a's during the cut"
            assert await count(centre_nc, "tracks", HUBS["hub-b"]) > b_before, "hub-b stopped reaching the centre"
            assert await count(hub_nc["hub-a"], "events", HUBS["hub-a"]) > a_local_before  # hub-a kept recording
            expected_b = (CUT_S - 2.0) * DIGEST_HZ
            assert all(abs(n - expected_b) <= 0.15 * expected_b + 2 for n in b_rates.values()), b_rates
            await topology.proxies["hub-a"].start()
            restored = time.monotonic()

            # Flights end (the replay's flights need the disarm); commanding stops; the centre catches up.
            for hub, vid in FLYING.items():
                assert (await local[hub].call(vid, "land", timeout_s=20.0)).accepted
            for hub, vid in FLYING.items():
                twin = gws[hub].twins[vid]
                await until(f"{vid} landed and disarmed", _sync(lambda t=twin: t.model.armed is False), 90)  # type: ignore[misc]
            stop.set()
            await commanding
            assert set(cmd_results) == {"accepted"}, cmd_results
        # The gateways are stopped: nothing more is published at the hubs.
        caught_up_s = await until("the centre caught up with both hubs", lambda: _caught_up(centre_nc, hub_nc),
                                  CATCH_UP_S, 1.0)
        print(f"central hubs: hub-a's backlog reached the centre {time.monotonic() - restored:.1f} s after its uplink "
              f"returned ({caught_up_s:.1f} s after the gateways stopped)")
        await asyncio.sleep(1.0)  # nothing more arrives: no duplicate still on its way
        for hub, vids in HUBS.items():
            for vid in vids:
                for kind in ("events", "tracks"):
                    stream, subject = per_vehicle(kind, vid)
                    here = await ids_in_order(centre_nc, stream, subject)
                    there = await ids_in_order(hub_nc[hub], stream, subject)
                    assert len(set(here)) == len(here) and "" not in here, f"{vid} {kind}: duplicates at the centre"
                    assert here == there, f"{vid} {kind}: {len(here)} at the centre, {len(there)} at {hub}"
                    if vid in FLYING.values() or kind == "events":
                        assert there, f"{vid} has no {kind}"

        # Exactly one result of the centre's command in the centre's stream (the one its issuer read there).
        assert live_at_centre == [], live_at_centre[:5]
        stored = [m for m in await _cmd_results(centre_nc) if m.get("cmd_id") == centre_cmd]
        assert len(stored) == 1, stored
        # Both hubs' TWIN_CMD heard it (the cost of un-scoped command subjects: docs/deploy.md); only hub-b ran it.
        strays = {hub: await on_subject(nc, "TWIN_CMD", f"fleet.{ENV}.veh.VID-004.cmd.>") for hub, nc in hub_nc.items()}
        assert strays == {"hub-a": 1, "hub-b": 0}, strays

        # The replay at the centre reads both hubs' flights (armed ... disarmed).
        last = (await centre_nc.jetstream().stream_info("TWIN_EVENTS")).state.last_seq
        replayed = await asyncio.to_thread(replay_rows, topology.centre[0].url, last)
        for vid in FLYING.values():
            kinds = [k for v, k in replayed if v == vid]
            assert "armed" in kinds and "disarmed" in kinds and kinds.index("armed") < kinds.index("disarmed"), kinds
        print(f"central hubs: whole test {time.monotonic() - t0:.0f} s")
    finally:
        stop.set()
        if commanding is not None and not commanding.done():
            commanding.cancel()
            await asyncio.gather(commanding, return_exceptions=True)
        for nc in (*hub_nc.values(), centre_nc):
            await nc.close()


def _sync(pred: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return pred()
    return check


async def _all_positive(nc: Client, vids: tuple[str, ...]) -> bool:
    return await count(nc, "events", vids) > 0 and await count(nc, "tracks", vids[:1]) > 0


async def _caught_up(centre_nc: Client, hub_nc: dict[str, Client]) -> bool:
    for hub, nc in hub_nc.items():
        for kind in ("events", "tracks"):
            if await count(centre_nc, kind, HUBS[hub]) < await count(nc, kind, HUBS[hub]):
                return False
    return True


async def _cmd_results(nc: Client) -> list[dict[str, Any]]:
    subject = f"fleet.{ENV}.veh.*.evt.cmd_result"
    total = await on_subject(nc, "TWIN_EVENTS", subject)
    out: list[dict[str, Any]] = []
    if not total:
        return out
    sub = await nc.jetstream().subscribe(subject, ordered_consumer=True,
                             config=jsapi.ConsumerConfig(deliver_policy=jsapi.DeliverPolicy.ALL))
    try:
        out = [envelope.unpack((await sub.next_msg(timeout=5.0)).data).data for _ in range(total)]
    finally:
        await sub.unsubscribe()
    return out
