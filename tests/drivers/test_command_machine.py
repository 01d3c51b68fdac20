"""CommandProtocol fed with crafted messages and a fake clock (no I/O)."""

from __future__ import annotations

import pytest

from mavjet.contract.errors import ConfigError
from mavjet.drivers.mavlink.command import (
    MAV_RESULT_CANCELLED,
    CommandConfig,
    CommandProtocol,
    CommandRequest,
    CommandResult,
    CommandState,
    mav_result_name,
)
from mavjet.drivers.mavlink.dialect import mavlink2
from tests.drivers.helpers import GCS_SYS, ack, heartbeat

TAKEOFF = mavlink2.MAV_CMD_NAV_TAKEOFF
ARM = mavlink2.MAV_CMD_COMPONENT_ARM_DISARM
CFG = CommandConfig(ack_timeout_s=1.0, max_attempts=3, in_progress_timeout_s=5.0)


def machine(command: int = TAKEOFF, p1: float = 0.0, **kw: object) -> CommandProtocol:
    req = CommandRequest(command=command, params=(p1, 0, 0, 0, 0, 0, 10.0), target_system=1, target_component=1)
    return CommandProtocol(request=req, config=CFG, **kw)  # type: ignore[arg-type]


def test_accepted_first_try() -> None:
    m = machine()
    out = m.start(100.0)
    assert len(out) == 1 and out[0].get_type() == "COMMAND_LONG"
    assert out[0].confirmation == 0 and out[0].param7 == 10.0
    assert m.state is CommandState.WAITING_ACK and m.next_deadline == 101.0
    m.on_message(ack(TAKEOFF, mavlink2.MAV_RESULT_ACCEPTED), 100.25)
    assert m.done and m.outcome is not None
    assert m.outcome.result is CommandResult.ACCEPTED and m.outcome.accepted
    assert m.outcome.attempts == 1
    assert m.outcome.latency_ms == pytest.approx(250.0)
    assert m.outcome.confirmed_by == "ack"


def test_retries_increment_confirmation_then_time_out() -> None:
    m = machine()
    sent = m.start(0.0)
    assert m.on_tick(0.5) == []  # before the deadline nothing happens
    sent += m.on_tick(1.0)
    sent += m.on_tick(2.0)
    assert [s.confirmation for s in sent] == [0, 1, 2]
    assert m.on_tick(3.0) == []
    assert m.done and m.outcome is not None
    assert m.outcome.result is CommandResult.TIMEOUT and m.outcome.mav_result is None
    assert m.outcome.attempts == 3


def test_retry_then_accept_counts_attempts() -> None:
    m = machine()
    m.start(0.0)
    assert m.on_tick(1.0)[0].confirmation == 1
    m.on_message(ack(TAKEOFF, mavlink2.MAV_RESULT_ACCEPTED), 1.1)
    assert m.outcome is not None and m.outcome.attempts == 2 and m.outcome.accepted


def test_mismatched_acks_are_ignored() -> None:
    m = machine()
    m.start(0.0)
    m.on_message(ack(mavlink2.MAV_CMD_NAV_LAND, mavlink2.MAV_RESULT_ACCEPTED), 0.1)  # other command
    m.on_message(ack(TAKEOFF, mavlink2.MAV_RESULT_ACCEPTED, sysid=7), 0.2)  # other vehicle
    m.on_message(heartbeat(armed=True), 0.3)  # not an ACK at all
    assert not m.done and m.ignored == 2
    m.on_message(ack(TAKEOFF, mavlink2.MAV_RESULT_DENIED), 0.4)
    assert m.outcome is not None and m.outcome.result is CommandResult.REJECTED
    assert m.outcome.mav_result == mavlink2.MAV_RESULT_DENIED and m.outcome.mav_result_name == "denied"


def test_ack_for_another_gcs_is_ignored_when_source_known() -> None:
    m = machine(source_system=GCS_SYS)
    m.start(0.0)
    m.on_message(ack(TAKEOFF, mavlink2.MAV_RESULT_ACCEPTED, target_system=255), 0.1)
    assert not m.done and m.ignored == 1
    m.on_message(ack(TAKEOFF, mavlink2.MAV_RESULT_ACCEPTED, target_system=GCS_SYS), 0.2)
    assert m.outcome is not None and m.outcome.accepted


@pytest.mark.parametrize(
    ("result", "name"),
    [
        (mavlink2.MAV_RESULT_TEMPORARILY_REJECTED, "temporarily_rejected"),
        (mavlink2.MAV_RESULT_DENIED, "denied"),
        (mavlink2.MAV_RESULT_UNSUPPORTED, "unsupported"),
        (mavlink2.MAV_RESULT_FAILED, "failed"),
        (MAV_RESULT_CANCELLED, "cancelled"),
        (mavlink2.MAV_RESULT_COMMAND_INT_ONLY, "command_int_only"),
    ],
)
def test_final_rejections(result: int, name: str) -> None:
    m = machine()
    m.start(0.0)
    m.on_message(ack(TAKEOFF, result), 0.1)
    assert m.outcome is not None and m.outcome.result is CommandResult.REJECTED
    assert m.outcome.mav_result == result and mav_result_name(result) == name
    assert m.on_tick(10.0) == []  # done is done: no retransmission


def test_in_progress_waits_longer_and_reports_progress() -> None:
    m = machine()
    m.start(0.0)
    m.on_message(ack(TAKEOFF, mavlink2.MAV_RESULT_IN_PROGRESS, progress=30), 0.5)
    assert m.state is CommandState.IN_PROGRESS and m.progress == 30
    assert m.next_deadline == 5.5
    assert m.on_tick(1.5) == []  # the ack timeout no longer applies: no retransmission
    m.on_message(ack(TAKEOFF, mavlink2.MAV_RESULT_IN_PROGRESS, progress=255), 4.0)  # unknown progress
    assert m.progress == 30 and m.next_deadline == 9.0
    m.on_message(ack(TAKEOFF, mavlink2.MAV_RESULT_ACCEPTED), 6.0)
    assert m.outcome is not None and m.outcome.accepted and m.outcome.progress == 100
    assert m.outcome.attempts == 1


def test_in_progress_that_goes_silent_times_out_without_resend() -> None:
    m = machine()
    m.start(0.0)
    m.on_message(ack(TAKEOFF, mavlink2.MAV_RESULT_IN_PROGRESS, progress=10), 0.2)
    assert m.on_tick(5.2) == []
    assert m.outcome is not None and m.outcome.result is CommandResult.TIMEOUT and m.outcome.progress == 10


def test_command_int_encoding() -> None:
    req = CommandRequest(
        command=mavlink2.MAV_CMD_DO_REPOSITION,
        params=(-1, 0, 0, float("nan"), -35.3632621, 149.1652374, 50.0),
        use_int=True,
        target_system=3,
        target_component=1,
    )
    msg = CommandProtocol(request=req, config=CFG).start(0.0)[0]
    assert msg.get_type() == "COMMAND_INT"
    assert (msg.x, msg.y, msg.z) == (-353632621, 1491652374, 50.0)
    assert msg.target_system == 3 and msg.frame == mavlink2.MAV_FRAME_GLOBAL_RELATIVE_ALT


def test_arm_missing_ack_asks_for_state_check_not_retry() -> None:
    m = machine(ARM, p1=1.0)
    m.start(0.0)
    assert m.on_tick(1.0) == []  # never blindly resend ARM
    assert m.state is CommandState.NEEDS_STATE_CHECK and m.attempts == 1
    assert m.resolve_state_check(True, 1.8) == []
    assert m.outcome is not None and m.outcome.accepted
    assert m.outcome.confirmed_by == "heartbeat" and m.outcome.attempts == 1


def test_arm_missing_ack_not_armed_retransmits_once_checked() -> None:
    m = machine(ARM, p1=1.0)
    m.start(0.0)
    m.on_tick(1.0)
    out = m.resolve_state_check(False, 1.5)
    assert len(out) == 1 and out[0].confirmation == 1 and out[0].param1 == 1.0
    assert m.state is CommandState.WAITING_ACK
    m.on_message(ack(ARM, mavlink2.MAV_RESULT_ACCEPTED), 1.7)
    assert m.outcome is not None and m.outcome.accepted and m.outcome.confirmed_by == "ack"
    assert m.outcome.attempts == 2


def test_disarm_check_wants_disarmed_and_no_heartbeat_is_timeout() -> None:
    m = machine(ARM, p1=0.0)
    m.start(0.0)
    m.on_tick(1.0)
    m.resolve_state_check(None, 3.5)
    assert m.outcome is not None and m.outcome.result is CommandResult.TIMEOUT

    m2 = machine(ARM, p1=0.0)
    m2.start(0.0)
    m2.on_tick(1.0)
    m2.resolve_state_check(False, 1.2)  # disarmed is what we asked for
    assert m2.outcome is not None and m2.outcome.accepted and m2.outcome.confirmed_by == "heartbeat"


def test_arm_late_ack_during_state_check_settles_it() -> None:
    m = machine(ARM, p1=1.0)
    m.start(0.0)
    m.on_tick(1.0)
    m.on_message(ack(ARM, mavlink2.MAV_RESULT_DENIED), 1.1)
    assert m.outcome is not None and m.outcome.result is CommandResult.REJECTED


def test_arm_checks_exhaust_attempts() -> None:
    m = machine(ARM, p1=1.0)
    m.start(0.0)
    now = 0.0
    for _ in range(5):
        now += 1.0
        m.on_tick(now)
        m.resolve_state_check(False, now)
        if m.done:
            break
    assert m.outcome is not None and m.outcome.result is CommandResult.TIMEOUT and m.outcome.attempts == 3


def test_config_validation() -> None:
    with pytest.raises(ConfigError) as err:
        CommandConfig(ack_timeout_s=0)
    assert err.value.key == "command.ack_timeout_s"
    with pytest.raises(ConfigError):
        CommandConfig(max_attempts=0)
    with pytest.raises(ConfigError):
        CommandRequest(command=1, params=(0.0,) * 6)  # type: ignore[arg-type]
