"""State publishing framed by the publisher (RawPublish) reaches NATS exactly as `nc.publish` would."""

from __future__ import annotations

import random
from pathlib import Path

import anyio
import anyio.abc
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from mavjet.contract import envelope, natsadapter
from mavjet.contract.natsconn import NatsOptions, open_client
from mavjet.contract.subjects import STATE_STREAM, state_subject
from mavjet.drivers.mavlink import reactor, transport
from mavjet.drivers.mavlink.transport import READ_SIZE, Endpoint, TcpTransport, open_transport
from mavjet.gateway.config import GatewayConfig, VehicleConfig
from mavjet.gateway.publish.publisher import Publisher
from mavjet.gateway.publish.spool import Spool
from mavjet.gateway.publish.statepub import RawPublish, StateAcks
from mavjet.gateway.publish.uplink import UplinkConfig
from mavjet.gateway.runtime.metrics import GatewayMetrics
from mavjet.gateway.twin.samples import EnvelopePacker
from mavjet.ops.natsserver import NatsServer
from tests.support.wait import wait_for_async


def _publisher(tmp_path: Path, url: str, *, ack_every: int) -> Publisher:
    cfg = GatewayConfig(vehicles=(VehicleConfig(vid="V1", endpoint=Endpoint.parse("tcp:127.0.0.1:1")),),
                        nats=NatsOptions(servers=(url,)), env="test", state_dir=tmp_path / "state",
                        state_ack_every=ack_every,
                        uplink=UplinkConfig(enabled=False))  # no shaping: a loaded machine is not a thin uplink
    return Publisher(cfg, Spool(tmp_path / "spool.sqlite", max_entries=100), GatewayMetrics())


async def _collect(url: str, subject: str, n: int, send: object) -> list[Msg]:
    got: list[Msg] = []
    done = anyio.Event()

    async def on(msg: Msg) -> None:
        got.append(msg)
        if len(got) >= n:
            done.set()

    watcher = await open_client(url)
    try:
        await watcher.subscribe(subject, cb=on)
        await watcher.flush()
        await send()  # type: ignore[operator]
        with anyio.fail_after(10):
            await done.wait()
    finally:
        await watcher.close()
    return got


async def test_framed_publishes_equal_nc_publish(nats_server: NatsServer, provisioned: Client) -> None:
    """Same subject, header and payload as `nc.publish(..., headers=...)`, stored by the stream."""
    raw = RawPublish({"Content-Type": envelope.CONTENT_TYPE})
    subject = state_subject("test", "V1", "position")
    payload = envelope.pack("V1", 1_700_000_000_123_456_789, {"lat_deg": 47.1, "text": "a\r\nb"})
    nc = provisioned
    assert natsadapter.has_write_buffer(nc)

    async def send() -> None:
        await nc.publish(subject, payload, headers={"Content-Type": envelope.CONTENT_TYPE})
        await natsadapter.write_commands(nc, [raw.frame(subject, payload), raw.frame(subject, payload + b"\x00")])
        await nc.flush()

    a, b, c = await _collect(nats_server.url, subject, 3, send)
    assert (a.subject, a.headers, a.data) == (b.subject, b.headers, b.data)
    assert c.data == payload + b"\x00" and c.headers == {"Content-Type": envelope.CONTENT_TYPE}
    # A core subscriber may see a message before the stream has stored it: wait for the store.
    js = nc.jetstream()

    async def stored() -> bool:
        return (await js.stream_info(STATE_STREAM)).state.messages == 3

    await wait_for_async(stored, timeout_s=10, what="3 messages stored")


async def test_publish_states_keeps_order_and_acks_every_nth(tmp_path: Path, nats_server: NatsServer,
                                                             provisioned: Client) -> None:
    pub = _publisher(tmp_path, nats_server.url, ack_every=4)
    async with anyio.create_task_group() as tg:
        await tg.start(pub.run)
        with anyio.fail_after(10):
            await pub.connected.wait()
        subject = state_subject("test", "V1", "attitude")
        batch = [(subject, envelope.pack("V1", 1_000 + i, {"i": i}), 0) for i in range(23)]

        async def send() -> None:
            await pub.publish_states(batch[:10])
            await pub.publish_states(batch[10:])
            assert pub.nc is not None
            await pub.nc.flush()

        got = await _collect(nats_server.url, subject, len(batch), send)
        assert [envelope.unpack(m.data).data["i"] for m in got] == list(range(23))
        assert all(m.headers == {"Content-Type": envelope.CONTENT_TYPE} for m in got)
        assert pub.state_published == 23 and pub.state_dropped == 0
        with anyio.fail_after(10):
            while pub._inflight:  # the acked ones (every 4th: 5 of 23) complete
                await anyio.sleep(0.01)
        acked = pub.metrics.registry.get_sample_value("mavjet_publishes_total",
                                                      {"kind": "state", "result": "acked"})
        plain = pub.metrics.registry.get_sample_value("mavjet_publishes_total",
                                                      {"kind": "state", "result": "plain"})
        assert (acked, plain) == (5.0, 18.0)
        tg.cancel_scope.cancel()
    assert pub.nc is not None
    await pub.nc.close()
    pub.spool.close()


async def test_publish_states_drops_while_disconnected(tmp_path: Path) -> None:
    pub = _publisher(tmp_path, "nats://127.0.0.1:1", ack_every=10)
    await pub.publish_states([("x.y", b"p", 0), ("x.z", b"q", 0)])
    assert (pub.state_published, pub.state_dropped) == (0, 2)
    pub.spool.close()


def test_envelope_packer_is_envelope_pack_byte_for_byte() -> None:
    rng = random.Random(5)
    times = [0, 1, 10**9, 2**32 * 10**9, (2**32 - 1) * 10**9, 2**34 * 10**9 - 1, 2**34 * 10**9, 2**40 * 10**9 + 7,
             1_763_939_000_000_000_000, 1_763_939_000_123_456_789]
    times += [rng.randrange(0, 2**36) * 10**9 + rng.choice((0, rng.randrange(10**9))) for _ in range(500)]
    for vid in ("V1", "VID-0001", "ü" * 40):
        packer = EnvelopePacker(vid)
        for t in times:
            data = {"lat_deg": rng.uniform(-90, 90), "n": rng.randrange(-5, 2**40), "s": "x", "none": None,
                    "nested": {"a": [1, 2.5]}}
            assert packer.pack(t, data) == envelope.pack(vid, t, data), (vid, t)
            env = envelope.unpack(packer.pack(t, data))
            assert (env.vid, env.time_ns, env.data) == (vid, t, data)


async def test_sampled_acks_count_errors_when_no_stream_stores(tmp_path: Path, nats_server: NatsServer) -> None:
    """Not provisioned: the server answers no-responders; each sampled publish is an error, none stays in flight."""
    pub = _publisher(tmp_path, nats_server.url, ack_every=1)
    async with anyio.create_task_group() as tg:
        await tg.start(pub.run)
        with anyio.fail_after(10):
            await pub.connected.wait()
        await pub.publish_states([(state_subject("test", "V1", "gps"), b"\x80", 0) for _ in range(5)])
        with anyio.fail_after(10):
            while pub._inflight:
                await anyio.sleep(0.01)
        errors = pub.metrics.registry.get_sample_value("mavjet_publishes_total", {"kind": "state", "result": "error"})
        assert errors == 5.0
        tg.cancel_scope.cancel()
    assert pub.nc is not None
    await pub.nc.close()
    pub.spool.close()


@pytest.mark.parametrize("reply", [b"", b"_INBOX.ab.17"])
def test_a_frame_is_the_hpub_command_even_with_percent_signs(reply: bytes) -> None:
    """The per-subject template is %-formatted: a '%' in the subject, a header or the payload stays literal."""
    raw = RawPublish({"Content-Type": envelope.CONTENT_TYPE, "X-Note": "100% %d %b"})
    subject, payload = "fleet.t.veh.V%d1.state.position", b"%b%d\r\n\x00" * 3
    hdr = raw.header
    line = f"HPUB {subject} {reply.decode() + ' ' if reply else ''}{len(hdr)} {len(hdr) + len(payload)}\r\n"
    for _ in range(2):  # the template made, then reused
        assert raw.frame(subject, payload, reply) == line.encode() + hdr + payload + b"\r\n"


def test_unanswered_acks_expire_oldest_first() -> None:
    acked: list[int] = []
    errors: list[str] = []
    acks = StateAcks("_INBOX.x", timeout_ns=1_000, on_ack=acked.append, on_error=errors.append)
    r1, r2 = acks.add(11, 0), acks.add(12, 500)
    assert (r1, r2) == (b"_INBOX.x.1", b"_INBOX.x.2") and len(acks) == 2
    acks.expire(1_200)  # the first is older than the timeout, the second is not
    assert len(acks) == 1 and len(errors) == 1 and acks.expired == 1
    acks.expire(1_600)
    assert len(acks) == 0 and len(errors) == 2 and acked == []


async def test_sockets_read_at_most_64_kib_at_a_time(tmp_path: Path, nats_server: NatsServer,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """asyncio's 256 KiB default read allocates a fresh mmap per read: the gateway's sockets use 64 KiB."""
    pub = _publisher(tmp_path, nats_server.url, ack_every=10)
    async with anyio.create_task_group() as tg:
        await tg.start(pub.run)
        with anyio.fail_after(10):
            await pub.connected.wait()
        nc = pub.nc
        assert nc is not None
        assert nc._transport._io_writer.transport.max_size == READ_SIZE == 64 * 1024  # type: ignore[union-attr]
        tg.cancel_scope.cancel()
    assert nc is not None
    await nc.close()
    pub.spool.close()
    assert reactor.READ_SIZE == READ_SIZE  # vehicle links read by the loop's epoll (drivers/mavlink/reactor.py)
    monkeypatch.setattr(transport, "USE_REACTOR", False)  # and through asyncio's transport without one
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener:
        t = await open_transport(Endpoint.parse(f"tcp:127.0.0.1:{port}"), connect_timeout_s=5)
        assert isinstance(t, TcpTransport)
        assert t._transport.max_size == READ_SIZE  # type: ignore[attr-defined]
        await t.aclose()
