"""Fault injection, and the vehicle's robustness against a bad link."""

from __future__ import annotations

import asyncio
import itertools
import random
import socket

from pymavlink.dialects.v20 import ardupilotmega as M

from mavjet.sim.fleet import SimFleet
from tests.support import wait_for
from tests.support.sim import MavClient, ready, running

ARM = M.MAV_CMD_COMPONENT_ARM_DISARM
OK = M.MAV_RESULT_ACCEPTED


def arms(fleet: SimFleet) -> list[object]:
    return [e for e in fleet.vehicles[0].executions if e.command == ARM and e.params[0] == 1.0]


async def test_retransmission_with_confirmation_is_acked_but_not_executed_twice(fleet: SimFleet, gcs: MavClient) -> None:
    v = fleet.vehicles[0]
    await ready(fleet)
    await gcs.set_mode(1, 4)
    v.drop_next("COMMAND_ACK", 1)  # the first ACK is lost on the way back
    i = gcs.mark()
    gcs.send(M.MAVLink_command_long_message(1, 1, ARM, 0, 1, 0, 0, 0, 0, 0, 0))
    await wait_for(lambda: v.armed, timeout_s=10, interval_s=0.02)
    await asyncio.sleep(0.2)
    assert not gcs.of("COMMAND_ACK", i)
    ack = await gcs.command_long(1, ARM, 1, confirmation=1)  # the ground station retries
    assert ack.result == OK
    ack = await gcs.command_long(1, ARM, 1, confirmation=2)
    assert ack.result == OK
    assert len(arms(fleet)) == 1
    assert v.stats.retransmits_recognised == 2
    # a fresh command (confirmation 0) is a new command and is executed
    await gcs.command_long(1, ARM, 0)
    await gcs.command_long(1, ARM, 1)
    assert len(arms(fleet)) == 2


async def test_retransmission_with_different_params_is_a_new_command(fleet: SimFleet, gcs: MavClient) -> None:
    await ready(fleet)
    await gcs.command_long(1, M.MAV_CMD_SET_MESSAGE_INTERVAL, 33, 100_000)
    await gcs.command_long(1, M.MAV_CMD_SET_MESSAGE_INTERVAL, 33, 200_000, confirmation=1)
    assert fleet.vehicles[0].schedule.interval(33) == 0.2
    assert len([e for e in fleet.vehicles[0].executions if e.command == M.MAV_CMD_SET_MESSAGE_INTERVAL]) == 2


async def test_drop_link_silences_both_ways_then_restores(fleet: SimFleet, gcs: MavClient) -> None:
    v = fleet.vehicles[0]
    await gcs.recv("HEARTBEAT")
    v.drop_link(1.0)
    await asyncio.sleep(0.1)
    i = gcs.mark()
    gcs.send(M.MAVLink_command_long_message(1, 1, M.MAV_CMD_SET_MESSAGE_INTERVAL, 0, 33, 100_000, 0, 0, 0, 0, 0))
    await asyncio.sleep(0.6)
    assert gcs.mark() == i  # nothing at all, not even heartbeats (10 Hz at 10x)
    assert not gcs.closed
    assert v.schedule.interval(33) is None  # the command was not heard
    hb = await gcs.recv("HEARTBEAT", since=i, timeout_s=3)
    assert v.link.frames_link_down > 0
    assert hb is not None


async def test_drop_link_close_drops_connections_and_refuses_until_over(fleet: SimFleet, gcs: MavClient) -> None:
    v = fleet.vehicles[0]
    await gcs.recv("HEARTBEAT")
    v.drop_link(0.8, close=True)
    await gcs.wait_closed(timeout_s=3)
    refused = 0
    back = None
    for _ in range(100):
        try:
            back = await MavClient.connect(fleet.endpoints[0])
            break
        except OSError:
            refused += 1
            await asyncio.sleep(0.05)
    assert refused > 0 and back is not None
    try:
        await back.recv("HEARTBEAT")
    finally:
        await back.close()


async def test_corruption_yields_bad_crc_at_the_receiver() -> None:
    async with running(corrupt=0.3) as fleet:
        gcs = await MavClient.connect(fleet.endpoints[0])
        try:
            gcs.send(M.MAVLink_command_long_message(1, 1, M.MAV_CMD_SET_MESSAGE_INTERVAL, 0, 30, 20_000, 0, 0, 0, 0, 0))
            await wait_for(lambda: gcs.bad >= 20 and len(gcs.of("ATTITUDE")) >= 20, timeout_s=10, interval_s=0.02)
            v = fleet.vehicles[0]
            assert v.link.frames_corrupted > 0
            # roughly the configured share of frames arrives damaged
            share = gcs.bad / (gcs.bad + len(gcs.messages))
            assert 0.1 < share < 0.6
        finally:
            await gcs.close()


async def test_loss_leaves_sequence_gaps() -> None:
    async with running(loss=0.3) as fleet:
        gcs = await MavClient.connect(fleet.endpoints[0])
        try:
            gcs.send(M.MAVLink_command_long_message(1, 1, M.MAV_CMD_SET_MESSAGE_INTERVAL, 0, 30, 20_000, 0, 0, 0, 0, 0))
            await wait_for(lambda: len(gcs.of("ATTITUDE")) >= 100, timeout_s=10, interval_s=0.02)
            seqs = [m.get_seq() for m in gcs.messages]
            gaps = sum(1 for a, b in itertools.pairwise(seqs) if (b - a) % 256 != 1)
            assert gaps > 10
            assert fleet.vehicles[0].link.frames_lost > 10
        finally:
            await gcs.close()


async def test_garbage_input_does_not_crash_the_vehicle(fleet: SimFleet, gcs: MavClient) -> None:
    v = fleet.vehicles[0]
    rng = random.Random(7)
    for _ in range(20):
        gcs.writer.write(rng.randbytes(500))
        gcs.writer.write(b"\xfd" + rng.randbytes(40))  # frame starts with junk after them
    # valid frames after the junk are understood again; like a ground station, retry a few times
    # (a junk 0xFD "start" may swallow the next frame while the parser waits for its claimed length)
    ack = None
    for _ in range(5):
        try:
            ack = await gcs.command_long(1, M.MAV_CMD_REQUEST_MESSAGE, M.MAVLINK_MSG_ID_AUTOPILOT_VERSION, timeout_s=1)
            break
        except TimeoutError:
            continue
    assert ack is not None and ack.result == OK
    assert v.stats.handler_errors == 0
    assert v.stats.bad_frames_in > 0


async def test_inject_garbage_reaches_the_client_and_stream_resumes(fleet: SimFleet, gcs: MavClient) -> None:
    v = fleet.vehicles[0]
    await gcs.recv("HEARTBEAT")
    junk = v.inject_garbage(2000)
    assert len(junk) == 2000 and v.link.garbage_bytes == 2000
    i = gcs.mark()
    await gcs.recv("HEARTBEAT", since=i)
    assert gcs.bad > 0


async def test_incoming_loss_makes_commands_go_unanswered() -> None:
    async with running(loss_in=1.0) as fleet:
        gcs = await MavClient.connect(fleet.endpoints[0])
        try:
            i = gcs.mark()
            gcs.send(M.MAVLink_command_long_message(1, 1, M.MAV_CMD_REQUEST_MESSAGE, 0, 148, 0, 0, 0, 0, 0, 0))
            await asyncio.sleep(0.5)
            assert not gcs.of("COMMAND_ACK", i)
            assert fleet.vehicles[0].link.frames_in_lost >= 1
        finally:
            await gcs.close()


async def test_slow_reader_does_not_grow_memory_without_bound() -> None:
    async with running(speedup=50.0) as fleet:
        # a client that connects, asks for a flood and never reads
        _, host, port = fleet.endpoints[0].split(":")
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fill up sooner
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
        _reader, writer = await asyncio.open_connection(sock=sock)
        try:
            mav = M.MAVLink(None, 255, 190)
            for msg_id in (30, 33, 1, 24, 74, 147, 245, 2):
                writer.write(M.MAVLink_command_long_message(1, 1, 511, 0, msg_id, 1000, 0, 0, 0, 0, 0).pack(mav))
            v = fleet.vehicles[0]
            await wait_for(lambda: v.link.frames_slow_client > 0, timeout_s=30, interval_s=0.02)
        finally:
            writer.close()
