"""MissionUpload / MissionDownload / MissionClear fed with crafted messages (no I/O)."""

from __future__ import annotations

import pytest

from mavjet.contract.errors import ProtocolError
from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.drivers.mavlink.mission import (
    FENCE,
    MISSION,
    MissionClear,
    MissionConfig,
    MissionDownload,
    MissionItem,
    MissionRejected,
    MissionTimeout,
    MissionUpload,
)
from mavjet.drivers.mavlink.plan import digest
from tests.drivers.helpers import wire

CFG = MissionConfig(item_timeout_s=1.0, max_retries=2)
ACCEPTED = mavlink2.MAV_MISSION_ACCEPTED


def items(n: int, mission_type: int = MISSION) -> tuple[MissionItem, ...]:
    return tuple(
        MissionItem(
            seq=i, frame=3, command=16, x=-353632621 + i * 1000, y=1491652374, z=30.0 + i * 0.1,
            param4=float("nan"), mission_type=mission_type,
        )
        for i in range(n)
    )  # fmt: skip


def request(seq: int, mission_type: int = MISSION, *, legacy: bool = False, sysid: int = 1) -> object:
    cls = mavlink2.MAVLink_mission_request_message if legacy else mavlink2.MAVLink_mission_request_int_message
    return wire(cls(245, 191, seq, mission_type), sysid=sysid)


def mack(result: int = ACCEPTED, mission_type: int = MISSION) -> object:
    return wire(mavlink2.MAVLink_mission_ack_message(245, 191, result, mission_type))


def upload(n: int = 3, mission_type: int = MISSION) -> MissionUpload:
    return MissionUpload(target_system=1, target_component=1, mission_type=mission_type, config=CFG, items=items(n, mission_type))


def test_upload_happy_path() -> None:
    m = upload(3)
    out = m.start(0.0)
    assert out[0].get_type() == "MISSION_COUNT" and out[0].count == 3 and out[0].mission_type == MISSION
    for seq in range(3):
        sent = m.on_message(request(seq), 0.1 * (seq + 1))
        assert len(sent) == 1 and sent[0].get_type() == "MISSION_ITEM_INT" and sent[0].seq == seq
        assert sent[0].x == -353632621 + seq * 1000
    m.on_message(mack(), 0.5)
    assert m.ok and m.error is None and m.resends == 0 and m.ignored == 0


def test_upload_duplicate_request_is_answered_again() -> None:
    m = upload(3)
    m.start(0.0)
    m.on_message(request(0), 0.1)
    m.on_message(request(1), 0.2)
    again = m.on_message(request(1), 0.3)  # our item 1 was lost; vehicle asks again
    assert len(again) == 1 and again[0].seq == 1
    older = m.on_message(request(0), 0.35)
    assert older[0].seq == 0
    m.on_message(request(2), 0.4)
    m.on_message(mack(), 0.5)
    assert m.ok


def test_upload_out_of_sequence_request_is_ignored() -> None:
    m = upload(4)
    m.start(0.0)
    m.on_message(request(0), 0.1)
    assert m.on_message(request(2), 0.2) == []  # skipped item 1: never answer
    assert m.ignored == 1 and m.highest_sent == 0
    assert m.on_message(request(1), 0.3)[0].seq == 1
    assert not m.done


def test_upload_request_beyond_count_fails() -> None:
    m = upload(2)
    m.start(0.0)
    m.on_message(request(5), 0.1)
    assert m.done and not m.ok and isinstance(m.error, ProtocolError)
    assert "requested item 5" in str(m.error)


def test_upload_legacy_mission_request_answered_with_item_int() -> None:
    m = upload(1)
    m.start(0.0)
    out = m.on_message(request(0, legacy=True), 0.1)
    assert out[0].get_type() == "MISSION_ITEM_INT"


def test_upload_ignores_other_mission_type_and_vehicle() -> None:
    m = upload(2)
    m.start(0.0)
    assert m.on_message(request(0, FENCE), 0.1) == []
    assert m.on_message(request(0, sysid=9), 0.1) == []
    assert m.highest_sent == -1


def test_upload_timeout_resends_last_message_bounded() -> None:
    m = upload(2)
    first = m.start(0.0)
    again = m.on_tick(1.0)
    assert again[0] is first[0] and m.retries == 1  # MISSION_COUNT again
    m.on_message(request(0), 1.2)
    assert m.retries == 0  # progress resets the consecutive count
    item_again = m.on_tick(2.2)
    assert item_again[0].get_type() == "MISSION_ITEM_INT" and item_again[0].seq == 0
    m.on_tick(3.2)
    assert not m.done and m.resends == 3
    m.on_tick(4.2)
    assert isinstance(m.error, MissionTimeout) and m.error.stage == "MISSION_REQUEST_INT 1"


def test_upload_rejected_by_ack() -> None:
    m = upload(2)
    m.start(0.0)
    m.on_message(request(0), 0.1)
    m.on_message(mack(mavlink2.MAV_MISSION_NO_SPACE), 0.2)
    assert isinstance(m.error, MissionRejected)
    assert m.error.result == mavlink2.MAV_MISSION_NO_SPACE and "no_space" in str(m.error)


def test_upload_early_accept_is_a_protocol_error() -> None:
    m = upload(3)
    m.start(0.0)
    m.on_message(request(0), 0.1)
    m.on_message(mack(), 0.2)
    assert m.done and not m.ok and "1 of 3" in str(m.error)


def test_upload_empty_fence_is_count_then_ack() -> None:
    m = upload(0, FENCE)
    out = m.start(0.0)
    assert out[0].count == 0 and out[0].mission_type == FENCE
    m.on_message(mack(mission_type=FENCE), 0.1)
    assert m.ok


def test_upload_rejects_misnumbered_items() -> None:
    bad = (MissionItem(seq=1, frame=3, command=16),)
    with pytest.raises(ProtocolError, match="seq"):
        MissionUpload(target_system=1, target_component=1, items=bad)


def count(n: int, mission_type: int = MISSION) -> object:
    return wire(mavlink2.MAVLink_mission_count_message(245, 191, n, mission_type))


def item_msg(item: MissionItem) -> object:
    return wire(item.to_message(245, 191))


def test_download_happy_path_and_digest_equals_upload() -> None:
    src = items(3)
    m = MissionDownload(target_system=1, target_component=1, config=CFG)
    out = m.start(0.0)
    assert out[0].get_type() == "MISSION_REQUEST_LIST"
    out = m.on_message(count(3), 0.1)
    assert out[0].get_type() == "MISSION_REQUEST_INT" and out[0].seq == 0
    for i, it in enumerate(src):
        out = m.on_message(item_msg(it), 0.2 + i * 0.1)
    assert out[0].get_type() == "MISSION_ACK" and out[0].type == ACCEPTED
    assert m.ok and len(m.items) == 3
    assert digest(m.items) == digest(src)  # float32 z and NaN param4 survive the trip


def test_download_duplicates_and_strays_ignored() -> None:
    src = items(3)
    m = MissionDownload(target_system=1, target_component=1, config=CFG)
    m.start(0.0)
    m.on_message(count(3), 0.1)
    m.on_message(count(3), 0.15)  # answer to a resent REQUEST_LIST
    m.on_message(item_msg(src[0]), 0.2)
    assert m.on_message(item_msg(src[0]), 0.25) == []  # duplicate
    assert m.on_message(item_msg(src[2]), 0.3) == []  # not asked for
    assert m.ignored == 3 and len(m.items) == 1
    resend = m.on_tick(1.2)
    assert resend[0].get_type() == "MISSION_REQUEST_INT" and resend[0].seq == 1
    m.on_message(item_msg(src[1]), 1.3)
    m.on_message(item_msg(src[2]), 1.4)
    assert m.ok and [i.seq for i in m.items] == [0, 1, 2]


def test_download_count_change_fails() -> None:
    m = MissionDownload(target_system=1, target_component=1, config=CFG)
    m.start(0.0)
    m.on_message(count(3), 0.1)
    m.on_message(count(4), 0.2)
    assert m.done and not m.ok and "count changed" in str(m.error)


def test_download_empty() -> None:
    m = MissionDownload(target_system=1, target_component=1, mission_type=FENCE, config=CFG)
    m.start(0.0)
    out = m.on_message(count(0, FENCE), 0.1)
    assert out[0].get_type() == "MISSION_ACK" and out[0].mission_type == FENCE and m.ok and m.items == []


def test_download_timeout() -> None:
    m = MissionDownload(target_system=1, target_component=1, config=CFG)
    m.start(0.0)
    m.on_tick(1.0)
    m.on_tick(2.0)
    m.on_tick(3.0)
    assert isinstance(m.error, MissionTimeout) and m.error.stage == "MISSION_COUNT"


def test_clear() -> None:
    m = MissionClear(target_system=1, target_component=1, config=CFG)
    out = m.start(0.0)
    assert out[0].get_type() == "MISSION_CLEAR_ALL"
    assert m.on_tick(1.0)[0].get_type() == "MISSION_CLEAR_ALL"
    m.on_message(mack(), 1.1)
    assert m.ok


def test_upload_final_item_is_not_resent_when_the_ack_is_lost() -> None:
    m = upload(2)
    m.start(0.0)
    m.on_message(request(0), 0.1)
    m.on_message(request(1), 0.2)
    assert m.awaiting_final_ack
    assert m.on_tick(1.2) == []  # a resent final item would draw MISSION_ACK(ERROR)
    assert not m.done
    again = m.on_message(request(1), 1.5)  # the vehicle re-requests a lost final item itself
    assert again[0].seq == 1 and m.retries == 0
    assert m.on_tick(2.5) == []
    assert m.on_tick(3.5) == []
    assert isinstance(m.error, MissionTimeout) and m.error.stage == "MISSION_ACK"


def test_download_accepts_legacy_mission_item() -> None:
    m = MissionDownload(target_system=1, target_component=1, config=CFG)
    m.start(0.0)
    m.on_message(count(1), 0.1)
    legacy = mavlink2.MAVLink_mission_item_message(
        245, 191, 0, mavlink2.MAV_FRAME_GLOBAL_RELATIVE_ALT, 16, 0, 1, 0, 0, 0, 0, -35.3632621, 149.1652374, 30.0
    )
    m.on_message(wire(legacy), 0.2)
    # float32 degrees lose up to ~4e-6 deg (≈ 40 units of 1e-7): why MISSION_ITEM_INT exists
    assert m.ok and abs(m.items[0].x + 353632621) <= 50 and abs(m.items[0].y - 1491652374) <= 100
