"""Sans-IO MAVLink command protocol (COMMAND_LONG / COMMAND_INT → COMMAND_ACK).

Why a state machine without I/O: the retry, matching and arming rules are the
part that must be right, and they are only testable exhaustively when a test
can feed crafted messages and a clock. `mavjet.drivers.mavlink.runner` drives this
machine over a live `MavPort`.

Rules (MAVLink command protocol, https://mavlink.io/en/services/command.html):
- A missing ACK is retried up to `max_attempts` times; every retransmission
  increments COMMAND_LONG's `confirmation` field so the autopilot can tell a
  retry from a new command (COMMAND_INT has no such field).
- An ACK answers us only if its command id is ours, it comes from the target
  system, and its target_system/target_component (when set) name us.
- MAV_RESULT_IN_PROGRESS stops retransmission (a retry would restart a long
  action) and waits with the longer `in_progress_timeout_s`, surfacing the
  progress percentage; every further IN_PROGRESS ack re-arms that timer.
- Arming/disarming is never retried blindly: on a missing ACK the machine
  enters `CommandState.NEEDS_STATE_CHECK` and the caller reports the armed
  state read from a fresh HEARTBEAT (`resolve_state_check`). If the vehicle is
  already in the requested state the command took effect (its ACK was lost);
  otherwise it is retransmitted; without a heartbeat it ends in timeout.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from mavjet.contract.errors import ConfigError
from mavjet.drivers.mavlink.dialect import MavMessage, mavlink2

MAV_CMD_COMPONENT_ARM_DISARM = mavlink2.MAV_CMD_COMPONENT_ARM_DISARM
MAV_RESULT_ACCEPTED = mavlink2.MAV_RESULT_ACCEPTED
MAV_RESULT_IN_PROGRESS = mavlink2.MAV_RESULT_IN_PROGRESS
MAV_RESULT_CANCELLED = 6  # in common.xml, missing from pymavlink 2.4.50's generated enum
PROGRESS_UNKNOWN = 255  # COMMAND_ACK.progress when the autopilot does not know

#: MAV_RESULT value → the lower-case name used in events and logs.
MAV_RESULT_NAMES: dict[int, str] = {
    mavlink2.MAV_RESULT_ACCEPTED: "accepted",
    mavlink2.MAV_RESULT_TEMPORARILY_REJECTED: "temporarily_rejected",
    mavlink2.MAV_RESULT_DENIED: "denied",
    mavlink2.MAV_RESULT_UNSUPPORTED: "unsupported",
    mavlink2.MAV_RESULT_FAILED: "failed",
    mavlink2.MAV_RESULT_IN_PROGRESS: "in_progress",
    MAV_RESULT_CANCELLED: "cancelled",
    mavlink2.MAV_RESULT_COMMAND_LONG_ONLY: "command_long_only",
    mavlink2.MAV_RESULT_COMMAND_INT_ONLY: "command_int_only",
}


def mav_result_name(result: int | None) -> str:
    """Readable name of a MAV_RESULT (or `none` when no ACK arrived)."""
    if result is None:
        return "none"
    return MAV_RESULT_NAMES.get(result, f"mav_result_{result}")


@dataclass(frozen=True, kw_only=True, slots=True)
class CommandConfig:
    """Timeouts and retry bounds of the command protocol."""

    ack_timeout_s: float = 1.0
    max_attempts: int = 3
    in_progress_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if not (0 < self.ack_timeout_s <= 60):
            raise ConfigError("command.ack_timeout_s", f"must be in (0, 60], got {self.ack_timeout_s}")
        if not (1 <= self.max_attempts <= 20):
            raise ConfigError("command.max_attempts", f"must be in [1, 20], got {self.max_attempts}")
        if not (0 < self.in_progress_timeout_s <= 3600):
            raise ConfigError(
                "command.in_progress_timeout_s", f"must be in (0, 3600], got {self.in_progress_timeout_s}"
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class CommandRequest:
    """One MAV_CMD to send. `params` are param1..param7.

    With `use_int` the command goes out as COMMAND_INT: params 5 and 6 become
    the int32 `x`/`y` (degrees * 1e7 in global frames) and param7 is `z`.
    """

    command: int
    params: tuple[float, float, float, float, float, float, float] = (0.0,) * 7
    use_int: bool = False
    frame: int = mavlink2.MAV_FRAME_GLOBAL_RELATIVE_ALT
    target_system: int = 1
    target_component: int = 1

    def __post_init__(self) -> None:
        if len(self.params) != 7:
            raise ConfigError("command.params", f"need 7 params, got {len(self.params)}")
        if not (0 <= self.command <= 65535):
            raise ConfigError("command.command", f"not a MAV_CMD id: {self.command}")

    @property
    def is_arm_disarm(self) -> bool:
        return bool(self.command == MAV_CMD_COMPONENT_ARM_DISARM)

    @property
    def wants_armed(self) -> bool:
        """For ARM_DISARM: param1 == 1 arms, 0 disarms."""
        return self.params[0] >= 0.5

    def build(self, confirmation: int) -> MavMessage:
        """The message for attempt `confirmation` (0 = first transmission)."""
        p = self.params
        if self.use_int:
            x = 0 if math.isnan(p[4]) else round(p[4] * 1e7)
            y = 0 if math.isnan(p[5]) else round(p[5] * 1e7)
            return mavlink2.MAVLink_command_int_message(
                self.target_system, self.target_component, self.frame, self.command,
                0, 0, p[0], p[1], p[2], p[3], x, y, p[6],
            )  # fmt: skip
        return mavlink2.MAVLink_command_long_message(
            self.target_system, self.target_component, self.command, min(confirmation, 255), *p
        )


class CommandState(enum.Enum):
    IDLE = "idle"
    WAITING_ACK = "waiting_ack"
    IN_PROGRESS = "in_progress"
    NEEDS_STATE_CHECK = "needs_state_check"
    DONE = "done"


class CommandResult(enum.Enum):
    """How the protocol ended (the MAV_RESULT is in `CommandOutcome.mav_result`)."""

    ACCEPTED = "accepted"
    REJECTED = "rejected"  # any final MAV_RESULT other than ACCEPTED
    TIMEOUT = "timeout"  # no ACK after every attempt (or IN_PROGRESS went silent)


@dataclass(frozen=True, kw_only=True, slots=True)
class CommandOutcome:
    """The end of one command: what happened, after how many transmissions and how long."""

    command: int
    result: CommandResult
    mav_result: int | None  # None when no final ACK arrived
    attempts: int
    latency_ms: float
    progress: int | None = None  # last IN_PROGRESS percentage seen, if any
    confirmed_by: str = "ack"  # "ack", or "heartbeat" when an arm/disarm ACK was lost

    @property
    def accepted(self) -> bool:
        return self.result is CommandResult.ACCEPTED

    @property
    def mav_result_name(self) -> str:
        return mav_result_name(self.mav_result)


@dataclass(slots=True)
class CommandProtocol:
    """Send one command, match its ACK, retry, and end with a `CommandOutcome`.

    Drive it with `start(now)`, `on_message(msg, now)` and `on_tick(now)`
    (when `now >= next_deadline`); each returns the messages to send.
    `source_system`/`source_component` are our own ids, used to ignore ACKs
    addressed to another ground station (0 disables that check).
    """

    request: CommandRequest
    config: CommandConfig = field(default_factory=CommandConfig)
    source_system: int = 0
    source_component: int = 0
    state: CommandState = CommandState.IDLE
    attempts: int = 0
    progress: int | None = None
    outcome: CommandOutcome | None = None
    next_deadline: float | None = None
    ignored: int = 0  # ACKs seen that answered something else
    in_progress_acks: int = 0  # MAV_RESULT_IN_PROGRESS answers so far
    _started_at: float = 0.0

    @property
    def done(self) -> bool:
        return self.state is CommandState.DONE

    def start(self, now: float) -> list[MavMessage]:
        if self.state is not CommandState.IDLE:
            raise RuntimeError("CommandProtocol.start called twice")
        self._started_at = now
        return self._transmit(now)

    def _transmit(self, now: float) -> list[MavMessage]:
        msg = self.request.build(confirmation=self.attempts)
        self.attempts += 1
        self.state = CommandState.WAITING_ACK
        self.next_deadline = now + self.config.ack_timeout_s
        return [msg]

    def _finish(self, now: float, result: CommandResult, mav_result: int | None, confirmed_by: str = "ack") -> None:
        self.state = CommandState.DONE
        self.next_deadline = None
        self.outcome = CommandOutcome(
            command=self.request.command,
            result=result,
            mav_result=mav_result,
            attempts=self.attempts,
            latency_ms=(now - self._started_at) * 1000.0,
            progress=self.progress,
            confirmed_by=confirmed_by,
        )

    def matches(self, msg: MavMessage) -> bool:
        """Is `msg` a COMMAND_ACK answering this command?"""
        if msg.get_type() != "COMMAND_ACK" or msg.command != self.request.command:
            return False
        if msg.get_srcSystem() != self.request.target_system:
            return False
        tgt_sys = getattr(msg, "target_system", 0)
        tgt_comp = getattr(msg, "target_component", 0)
        if self.source_system and tgt_sys and tgt_sys != self.source_system:
            return False
        return not (self.source_component and tgt_comp and tgt_comp != self.source_component)

    def on_message(self, msg: MavMessage, now: float) -> list[MavMessage]:
        if self.state not in (CommandState.WAITING_ACK, CommandState.IN_PROGRESS, CommandState.NEEDS_STATE_CHECK):
            return []
        if msg.get_type() != "COMMAND_ACK":
            return []
        if not self.matches(msg):
            self.ignored += 1
            return []
        result = int(msg.result)
        if result == MAV_RESULT_IN_PROGRESS:
            self.state = CommandState.IN_PROGRESS
            self.in_progress_acks += 1
            progress = int(msg.progress)
            if progress != PROGRESS_UNKNOWN:
                self.progress = min(progress, 100)
            self.next_deadline = now + self.config.in_progress_timeout_s
            return []
        if result == MAV_RESULT_ACCEPTED:
            if self.progress is not None:
                self.progress = 100
            self._finish(now, CommandResult.ACCEPTED, result)
        else:
            self._finish(now, CommandResult.REJECTED, result)
        return []

    def on_tick(self, now: float) -> list[MavMessage]:
        """Call when `now >= next_deadline`: retry, ask for a state check, or time out."""
        if self.next_deadline is None or now < self.next_deadline:
            return []
        if self.state is CommandState.IN_PROGRESS:
            # The autopilot went silent mid-action: retransmitting would restart it.
            self._finish(now, CommandResult.TIMEOUT, None)
            return []
        if self.state is CommandState.NEEDS_STATE_CHECK:
            # The caller never resolved the check before its own deadline.
            self._finish(now, CommandResult.TIMEOUT, None)
            return []
        if self.state is not CommandState.WAITING_ACK:
            return []
        if self.request.is_arm_disarm:
            self.state = CommandState.NEEDS_STATE_CHECK
            self.next_deadline = None  # the caller bounds its own wait for a heartbeat
            return []
        if self.attempts >= self.config.max_attempts:
            self._finish(now, CommandResult.TIMEOUT, None)
            return []
        return self._transmit(now)

    def resolve_state_check(self, armed: bool | None, now: float) -> list[MavMessage]:
        """Report the armed state from a HEARTBEAT received after the ACK timeout.

        `None` means no heartbeat arrived: the outcome is a timeout, because
        sending ARM again without knowing the state is what this avoids.
        """
        if self.state is not CommandState.NEEDS_STATE_CHECK:
            return []
        if armed is None:
            self._finish(now, CommandResult.TIMEOUT, None)
            return []
        if armed == self.request.wants_armed:
            self._finish(now, CommandResult.ACCEPTED, MAV_RESULT_ACCEPTED, confirmed_by="heartbeat")
            return []
        if self.attempts >= self.config.max_attempts:
            self._finish(now, CommandResult.TIMEOUT, None)
            return []
        return self._transmit(now)
