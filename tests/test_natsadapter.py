"""nats-py's private API is used in one module, `mavjet.contract.natsadapter`, behind its version guard.

Three checks: no other source touches a private member of nats-py (an AST
scan for the names nats-py's own source defines, which also catches what
ruff's SLF rule cannot see: `getattr` with a string, a subclass reaching
its base's members through `self`); ruff's SLF rule is on with only the
adapter modules excused; and on a nats-py version the guard does not know,
every use takes its public way against a real nats-server, with the same
messages.

The tests that hold the adapter to the installed nats-py, to run before a
version joins `VERIFIED`: this file, tests/gateway/test_natsconn_flush.py,
tests/gateway/test_publisher_raw.py, tests/gateway/test_publisher_direct.py,
tests/gateway/test_direct_delivery.py, tests/commands/test_pull.py,
tests/analytics/test_natsfast.py, tests/ops/test_logstore.py.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig
from structlog.testing import capture_logs

from mavjet.contract import envelope, natsadapter
from mavjet.contract.natsconn import NatsOptions, open_client
from mavjet.contract.subjects import EVENTS_STREAM, STATE_STREAM, event_subject, state_subject
from mavjet.drivers.mavlink.transport import Endpoint
from mavjet.gateway.commands.pull import PullOne
from mavjet.gateway.config import GatewayConfig, VehicleConfig
from mavjet.gateway.publish.publisher import Publisher
from mavjet.gateway.publish.spool import Spool
from mavjet.gateway.publish.statepub import subscribe_direct
from mavjet.gateway.publish.uplink import UplinkConfig
from mavjet.gateway.runtime.metrics import GatewayMetrics
from mavjet.ops.natsserver import NatsServer
from tests.support.natsorder import ordered_deliveries

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("contract", "drivers", "gateway", "ops", "sim", "analytics", "benchmarks")
ADAPTER = "contract/natsadapter.py"
# Each library's one adapter module (pyproject.toml says why for each): ruff's SLF rule excuses these only.
SLF_EXCUSED = {ADAPTER, "drivers/mavlink/inbound.py", "analytics/classcache.py", "tests/**"}


def _nats_private_names() -> frozenset[str]:
    """Every `_name` nats-py's own source gives a member: `self._x = ...`, `def _x`, class-level `_x = ...`."""
    names: set[str] = set()
    for path in Path(nats.__file__).parent.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                names.add(node.attr)
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        names.add(item.name)
                    elif isinstance(item, ast.Assign | ast.AnnAssign):
                        targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                        names.update(t.id for t in targets if isinstance(t, ast.Name))
    return frozenset(n for n in names if n.startswith("_") and not n.startswith("__"))


NATS_PRIVATE = _nats_private_names()


def _sources() -> Iterator[tuple[str, ast.Module]]:
    for layer in SOURCES:
        for path in sorted((ROOT / layer).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel != ADAPTER:
                yield rel, ast.parse(path.read_text(encoding="utf-8"), filename=rel)


def _nats_imports(tree: ast.Module) -> set[str]:
    """The local names this module binds to something of nats-py (`from nats... import X`, `import nats`)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "nats":
            out.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Import):
            out.update((a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] == "nats")
    return out


def _base_name(base: ast.expr) -> str:
    while isinstance(base, ast.Attribute):
        base = base.value
    return base.id if isinstance(base, ast.Name) else ""


def _violations(rel: str, tree: ast.Module) -> list[str]:
    found: list[str] = []
    nats_names = _nats_imports(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in NATS_PRIVATE:
            # `self._x` is the class's own member, unless the class is nats-py's (checked below).
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(f"{rel}:{node.lineno}: .{node.attr}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and node.args[1].value in NATS_PRIVATE):
            found.append(f"{rel}:{node.lineno}: {node.func.id}(..., {node.args[1].value!r})")
        elif isinstance(node, ast.ClassDef) and any(_base_name(b) in nats_names for b in node.bases):
            found.append(f"{rel}:{node.lineno}: class {node.name} subclasses nats-py's {ast.unparse(node.bases[0])}")
    return found


def test_the_scan_knows_nats_py_s_private_names() -> None:
    """The names the adapter uses are among those the scan looks for, so the scan would see them elsewhere."""
    assert {"_pending", "_transport", "_pending_queue", "_nms", "_deliver", "_jsi", "_process_msg",
            "_parse_header_lines", "_send_ping", "_flush_pending", "_nc"} <= NATS_PRIVATE


def test_the_scan_finds_a_private_use() -> None:
    """A module written as the old statepub and natsfast were is caught, in each of the three ways."""
    tree = ast.parse("from nats.aio.client import Client\n"
                     "def f(nc):\n    nc._pending.append(b'')\n    return getattr(nc, '_process_msg', None)\n"
                     "class C(Client):\n    pass\n")
    assert len(_violations("x.py", tree)) == 3


def test_nothing_but_the_adapter_touches_nats_py_s_private_members() -> None:
    found = [v for rel, tree in _sources() for v in _violations(rel, tree)]
    assert found == [], "nats-py's private API goes through contract/natsadapter.py only:\n" + "\n".join(found)


def test_ruff_s_slf_rule_is_on_and_excuses_only_the_adapters() -> None:
    lint = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["ruff"]["lint"]
    assert "SLF" in lint["select"]
    excused = {path for path, rules in lint["per-file-ignores"].items()
               if any(r == "SLF" or r.startswith("SLF0") for r in rules)}
    assert excused == SLF_EXCUSED


def test_the_installed_nats_py_is_verified() -> None:
    """Fails after a nats-py upgrade until the adapter is audited for it (the module docstring says how)."""
    assert natsadapter.NATS_PY_VERSION in natsadapter.VERIFIED
    assert natsadapter.check_version() is True and natsadapter.internals()


# -- an unknown version: the public ways, against a real server --------------------------------


@pytest.fixture
def unknown_version() -> Iterator[None]:
    """The guard as on a nats-py it was not verified against; the installed version's decision after."""
    assert natsadapter.check_version("99.0.0") is False
    try:
        yield
    finally:
        natsadapter.check_version()


@pytest.fixture
async def client(nats_server: NatsServer, unknown_version: None) -> AsyncIterator[Client]:
    nc = await open_client(nats_server.url, connect_timeout=2, max_reconnect_attempts=5)
    try:
        yield nc
    finally:
        await nc.close()


def test_an_unknown_version_is_said_once(unknown_version: None) -> None:
    with capture_logs() as logs:
        assert not natsadapter.internals()
        assert not natsadapter.internals()
    said = [e for e in logs if e["event"] == "nats_py_unverified"]
    assert len(said) == 1 and said[0]["version"] == "99.0.0"


async def test_an_unknown_version_takes_the_public_ways(client: Client) -> None:
    """The client, the write buffer, the direct queue and the analytics short cut all leave nats-py as it is."""
    assert isinstance(client, natsadapter.FlushTwiceClient)
    assert not isinstance(client, natsadapter.OrderedFlushClient)
    assert not natsadapter.has_write_buffer(client)
    assert natsadapter.stream_transport(client) is None
    parse_before = client._ps.parse

    async def cb(_: Msg) -> None:
        return None

    assert natsadapter.install_ordered_short_cut(client, cb, lambda *_: None) is False
    assert natsadapter.install_header_parser(client, lambda _: {}) is False
    assert client._ps.parse == parse_before and "_parse_header_lines" not in vars(client)
    got: list[bytes] = []
    assert await subscribe_direct(client, "direct.x", lambda m: got.append(m.data)) is False
    await client.flush()
    await client.publish("direct.x", b"1")
    await client.publish("direct.x", b"2")
    with anyio.fail_after(5):
        while len(got) < 2:
            await anyio.sleep(0.01)
    assert got == [b"1", b"2"]


async def test_the_public_flush_still_orders_a_subscription_before_another_connection_s_publish(
        nats_server: NatsServer, client: Client) -> None:
    """`FlushTwiceClient`: what `OrderedFlushClient` guarantees (tests/gateway/test_natsconn_flush.py), publicly."""
    other = await open_client(nats_server.url)
    try:
        seen = await ordered_deliveries(client, other, rounds=50, prefix="order")
    finally:
        await other.close()
    assert seen == 50


async def test_an_unknown_version_pulls_commands_with_fetch(client: Client) -> None:
    js = client.jetstream()
    await js.add_stream(name="PULLV", subjects=["pullv.>"])
    await js.add_consumer("PULLV", ConsumerConfig(durable_name="d", ack_policy=AckPolicy.EXPLICIT))
    psub = await js.pull_subscribe_bind(durable="d", stream="PULLV")
    pull = PullOne(psub)
    assert natsadapter.PullInternals.present(psub) and not pull.fast  # there, and not used
    await js.publish("pullv.cmd", b"c1")
    with anyio.fail_after(10):
        msg = await pull.next(2.0)
        assert msg is not None and msg.data == b"c1"
        await msg.ack_sync()
        assert await pull.next(0.05) is None


async def test_an_unknown_version_publishes_state_and_results_through_the_public_api(
        tmp_path: Path, nats_server: NatsServer, provisioned: Client, unknown_version: None) -> None:
    """The publisher: `nc.publish` / `js.publish_async` for state, `js.publish` for a result; the stream has them all."""
    cfg = GatewayConfig(vehicles=(VehicleConfig(vid="V1", endpoint=Endpoint.parse("tcp:127.0.0.1:1")),),
                        nats=NatsOptions(servers=(nats_server.url,)), env="test", state_dir=tmp_path / "state",
                        state_ack_every=4, uplink=UplinkConfig(enabled=False))
    pub = Publisher(cfg, Spool(tmp_path / "spool.sqlite", max_entries=100), GatewayMetrics())
    js = provisioned.jetstream()
    await pub.spool.open()  # as the daemon does: a result skips the spool only when it is known empty
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(pub.run)
            with anyio.fail_after(10):
                await pub.connected.wait()
            assert pub.nc is not None and not pub._raw_ok and not isinstance(pub.nc, natsadapter.OrderedFlushClient)
            subject = state_subject("test", "V1", "attitude")
            await pub.publish_states([(subject, envelope.pack("V1", 1_000 + i, {"i": i}), 0) for i in range(8)])
            result = (event_subject("test", "V1", "cmd_result"), "V1:cmd_result:c1", b"result")
            assert await pub.publish_event_now(*result) is True
            await pub.nc.flush()
            with anyio.fail_after(10):
                while pub._inflight:
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
        assert (pub.state_published, pub.state_dropped, pub.events_direct) == (8, 0, 1)
        acked = pub.metrics.registry.get_sample_value("mavjet_publishes_total", {"kind": "state", "result": "acked"})
        assert acked == 2.0
        state = await js.get_last_msg(STATE_STREAM, subject)
        assert envelope.unpack(state.data or b"").data == {"i": 7}
        stored = await js.get_last_msg(EVENTS_STREAM, result[0])
        assert stored.data == b"result" and (stored.headers or {}).get("Nats-Msg-Id") == result[1]
    finally:
        if pub.nc is not None:
            await pub.nc.close()
        pub.spool.close()

