"""A command result straight to the stream (`Publisher.publish_event_now`), only where it keeps the order.

Real nats-server, real spool files. The rule under test: a result skips the
spool only when nothing of its vehicle handed over earlier is still unsent,
and never while a spool left by an earlier run is undrained.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
from nats.aio.client import Client

from mavjet.contract.natsconn import NatsOptions
from mavjet.contract.subjects import EVENTS_STREAM, event_subject
from mavjet.drivers.mavlink.transport import Endpoint
from mavjet.gateway.config import GatewayConfig, VehicleConfig
from mavjet.gateway.publish.publisher import Publisher
from mavjet.gateway.publish.spool import Spool
from mavjet.gateway.publish.statepub import pub_ack_error
from mavjet.gateway.publish.uplink import UplinkConfig
from mavjet.gateway.runtime.metrics import GatewayMetrics
from mavjet.ops.natsserver import NatsServer


def _publisher(tmp_path: Path, url: str) -> Publisher:
    cfg = GatewayConfig(vehicles=(VehicleConfig(vid="V1", endpoint=Endpoint.parse("tcp:127.0.0.1:1")),),
                        nats=NatsOptions(servers=(url,)), env="test", state_dir=tmp_path / "state",
                        publish_timeout_s=2.0, uplink=UplinkConfig(enabled=False))
    return Publisher(cfg, Spool(tmp_path / "spool.sqlite", max_entries=100), GatewayMetrics())


@asynccontextmanager
async def _running(pub: Publisher) -> AsyncIterator[Publisher]:
    await pub.spool.open()
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(pub.run)
            with anyio.fail_after(10):
                await pub.connected.wait()
            yield pub
            tg.cancel_scope.cancel()
    finally:
        if pub.nc is not None:
            await pub.nc.close()
        pub.spool.close()


def _result(vid: str, n: int) -> tuple[str, str, bytes]:
    return event_subject("test", vid, "cmd_result"), f"{vid}:cmd_result:c{n}", f"{vid}/result/{n}".encode()


def _text(vid: str, n: int) -> tuple[str, str, bytes]:
    return event_subject("test", vid, "statustext"), f"{vid}:statustext:{n}", f"{vid}/text/{n}".encode()


async def _stored(nc: Client, vid: str) -> list[bytes]:
    js = nc.jetstream()
    info = await js.stream_info(EVENTS_STREAM)
    out: list[bytes] = []
    if not info.state.messages:
        return out
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        m = await js.get_msg(EVENTS_STREAM, seq)
        if m.subject and f".veh.{vid}." in m.subject:
            out.append(m.data or b"")
    return out


async def _drained(pub: Publisher) -> None:
    with anyio.fail_after(10):
        while pub.spool.depth or pub.events_waiting:  # bounded by fail_after
            await anyio.sleep(0.02)


async def test_a_result_goes_straight_to_the_stream_when_nothing_waits(nats_server: NatsServer,
                                                                         provisioned: Client,
                                                                         tmp_path: Path) -> None:
    async with _running(_publisher(tmp_path, nats_server.url)) as pub:
        assert await pub.publish_event_now(*_result("V1", 1)) is True
        assert pub.events_direct == 1 and pub.spool.depth == 0 and pub.events_enqueued == 1
        assert await _stored(provisioned, "V1") == [b"V1/result/1"]
        # The same msg id again (a redelivered command's result): the stream keeps one copy.
        assert await pub.publish_event_now(*_result("V1", 1)) is True
        assert await _stored(provisioned, "V1") == [b"V1/result/1"]


async def test_an_earlier_event_of_the_vehicle_keeps_its_place(nats_server: NatsServer, provisioned: Client,
                                                                tmp_path: Path) -> None:
    async with _running(_publisher(tmp_path, nats_server.url)) as pub:
        pub.enqueue_event(*_text("V1", 1))
        # V1 has an event handed over and not yet sent: its result must go behind it, through the spool.
        assert await pub.publish_event_now(*_result("V1", 2)) is False
        # Another vehicle is not held up by V1's event.
        assert await pub.publish_event_now(*_result("V2", 3)) is True
        pub.enqueue_event(*_result("V1", 2))  # what the executor does with a False
        await _drained(pub)
        assert await _stored(provisioned, "V1") == [b"V1/text/1", b"V1/result/2"]
        assert pub.events_direct == 1
        # Everything of V1 sent: its next result goes straight again.
        assert await pub.publish_event_now(*_result("V1", 4)) is True
        assert await _stored(provisioned, "V1") == [b"V1/text/1", b"V1/result/2", b"V1/result/4"]
        assert pub.events_enqueued == 4 and pub.events_published == 4


async def test_a_spool_left_by_an_earlier_run_is_drained_first(nats_server: NatsServer, provisioned: Client,
                                                               tmp_path: Path) -> None:
    left = Spool(tmp_path / "spool.sqlite", max_entries=100)
    # No stream takes this subject: the drain fails and keeps it, so the spool stays undrained.
    left.append_sync([("elsewhere.V9.evt.statustext", "V9:left:1", b"left")])
    left.close()
    async with _running(_publisher(tmp_path, nats_server.url)) as pub:
        assert pub.spool.depth == 1
        # Whose events that spool holds is not known: nothing may overtake them.
        assert await pub.publish_event_now(*_result("V1", 1)) is False
        assert await _stored(provisioned, "V1") == [] and pub.events_direct == 0


async def test_no_connection_or_no_stream_means_the_spool(nats_server: NatsServer, provisioned: Client,
                                                          tmp_path: Path) -> None:
    never = _publisher(tmp_path / "never", nats_server.url)
    assert await never.publish_event_now(*_result("V1", 1)) is False  # never connected: nothing tried
    assert never.events_enqueued == 0
    async with _running(_publisher(tmp_path, nats_server.url)) as pub:
        # An error ack (no stream for the subject): False, counted as an error, not as handed over.
        assert await pub.publish_event_now("elsewhere.V1.evt.cmd_result", "V1:x", b"x") is False
        assert pub.events_enqueued == 0 and pub.events_direct == 0
        errors = pub.metrics.registry.get_sample_value("mavjet_publishes_total",
                                                       {"kind": "event", "result": "error"})
        assert errors == 1.0


async def test_an_oversized_result_is_not_sent_and_the_connection_stays(nats_server: NatsServer,
                                                                         provisioned: Client,
                                                                         tmp_path: Path) -> None:
    async with _running(_publisher(tmp_path, nats_server.url)) as pub:
        assert pub.nc is not None
        subject, msg_id, _ = _result("V1", 1)
        # The server would close the connection on a message over its max_payload: refused before sending.
        assert await pub.publish_event_now(subject, msg_id, b"x" * (pub.nc.max_payload + 1)) is False
        assert pub.is_connected and pub.events_direct == 0
        assert await pub.publish_event_now(*_result("V1", 2)) is True
        assert await _stored(provisioned, "V1") == [b"V1/result/2"]


async def test_no_ack_in_time_means_the_spool(nats_server: NatsServer, provisioned: Client, tmp_path: Path) -> None:
    # A listener that never answers: the server has a responder, so no 503, and no ack either.
    silent = await provisioned.subscribe("elsewhere.V1.evt.cmd_result")
    try:
        async with _running(_publisher(tmp_path, nats_server.url)) as pub:
            t0 = anyio.current_time()
            assert await pub.publish_event_now("elsewhere.V1.evt.cmd_result", "V1:x", b"x") is False
            waited_s = anyio.current_time() - t0
            assert 1.5 <= waited_s <= 6.0, waited_s  # publish_timeout_s is 2 s
            assert pub.events_direct == 0 and pub.events_enqueued == 0
            assert await pub.publish_event_now(*_result("V1", 3)) is True  # the next one is not held up
    finally:
        await silent.unsubscribe()


def test_pub_ack_error_reads_acks_refusals_and_statuses() -> None:
    assert pub_ack_error(b'{"stream":"TWIN_EVENTS","seq":7}', None) is None
    assert pub_ack_error(b'{"stream":"TWIN_EVENTS","seq":7,"duplicate":true}', {}) is None
    refused = pub_ack_error(b'{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"}}', None)
    assert refused is not None and "maximum messages exceeded" in refused
    assert pub_ack_error(b"", {"Status": "503"}) == "no responders (status 503)"
    assert pub_ack_error(b"", None) == "empty ack (status )"
    assert (pub_ack_error(b"not json", None) or "").startswith("not an ack")
    assert (pub_ack_error(b"[1, 2]", None) or "").startswith("refused")
