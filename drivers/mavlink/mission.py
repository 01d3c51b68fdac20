"""Sans-IO MAVLink mission protocol: upload, download and clear.

Covers mission_type MISSION, FENCE and RALLY, which share one protocol
(https://mavlink.io/en/services/mission.html). The vehicle drives an upload
(it requests each item), the ground station drives a download. On a lossy
link either side's message can vanish, so every wait has a timeout after
which the machine resends its last message, with a bounded number of
consecutive retries (progress resets the count).

Out-of-sequence handling:
- Upload: a request for an item already sent is answered again (our item was
  lost); a request beyond the next unsent item is ignored and counted (the
  vehicle is confused; its own timeout will re-request in order); a request
  for seq >= count fails the upload. The final item is never resent on a
  timeout (see `MissionUpload.on_tick`).
- Download: items other than the one requested are ignored and counted.

Items are `MissionItem`s carrying the MISSION_ITEM_INT fields; float fields
are float32 on the wire, so compare items with `MissionItem.canonical()`.

One module on purpose: the upload, download and clear machines share their
item conversion, retry and timeout rules, and the whole protocol reads top to
bottom.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, replace

from mavjet.contract.errors import ConfigError, ProtocolError
from mavjet.drivers.mavlink.dialect import MavMessage, mavlink2
from mavjet.drivers.mavlink.params import to_float32

MISSION = mavlink2.MAV_MISSION_TYPE_MISSION
FENCE = mavlink2.MAV_MISSION_TYPE_FENCE
RALLY = mavlink2.MAV_MISSION_TYPE_RALLY
MISSION_TYPE_NAMES = {MISSION: "mission", FENCE: "fence", RALLY: "rally"}
MAV_MISSION_ACCEPTED = mavlink2.MAV_MISSION_ACCEPTED
MAX_ITEMS = 65535  # MISSION_COUNT.count is uint16

#: Frames whose x/y are latitude/longitude (degrees * 1e7 in MISSION_ITEM_INT).
GLOBAL_FRAMES = frozenset(
    {
        mavlink2.MAV_FRAME_GLOBAL,
        mavlink2.MAV_FRAME_GLOBAL_RELATIVE_ALT,
        mavlink2.MAV_FRAME_GLOBAL_INT,
        mavlink2.MAV_FRAME_GLOBAL_RELATIVE_ALT_INT,
        mavlink2.MAV_FRAME_GLOBAL_TERRAIN_ALT,
        mavlink2.MAV_FRAME_GLOBAL_TERRAIN_ALT_INT,
    }
)

MAV_MISSION_RESULT_NAMES: dict[int, str] = {
    mavlink2.MAV_MISSION_ACCEPTED: "accepted",
    mavlink2.MAV_MISSION_ERROR: "error",
    mavlink2.MAV_MISSION_UNSUPPORTED_FRAME: "unsupported_frame",
    mavlink2.MAV_MISSION_UNSUPPORTED: "unsupported",
    mavlink2.MAV_MISSION_NO_SPACE: "no_space",
    mavlink2.MAV_MISSION_INVALID: "invalid",
    mavlink2.MAV_MISSION_INVALID_PARAM1: "invalid_param1",
    mavlink2.MAV_MISSION_INVALID_PARAM2: "invalid_param2",
    mavlink2.MAV_MISSION_INVALID_PARAM3: "invalid_param3",
    mavlink2.MAV_MISSION_INVALID_PARAM4: "invalid_param4",
    mavlink2.MAV_MISSION_INVALID_PARAM5_X: "invalid_param5_x",
    mavlink2.MAV_MISSION_INVALID_PARAM6_Y: "invalid_param6_y",
    mavlink2.MAV_MISSION_INVALID_PARAM7: "invalid_param7",
    mavlink2.MAV_MISSION_INVALID_SEQUENCE: "invalid_sequence",
    mavlink2.MAV_MISSION_DENIED: "denied",
    mavlink2.MAV_MISSION_OPERATION_CANCELLED: "operation_cancelled",
}


def mission_type_name(mission_type: int) -> str:
    return MISSION_TYPE_NAMES.get(mission_type, f"mission_type_{mission_type}")


def item_label(mission_type: int, seq: int) -> str:
    """Where item `seq` of an upload came from: `mission.items[4]` (seq 0 of a MISSION is the home)."""
    if mission_type == MISSION:
        return "mission home (seq 0)" if seq == 0 else f"mission.items[{seq - 1}] (seq {seq})"
    return f"{mission_type_name(mission_type)} item seq {seq}"


class MissionRejected(ProtocolError):
    """The vehicle ended a mission transfer with a MISSION_ACK other than ACCEPTED.

    `seq` is the item the vehicle refused (the last one it was sent) when the
    refusal came during an upload, so the result can name the item.
    """

    def __init__(self, protocol: str, result: int, mission_type: int, *, seq: int | None = None, why: str = "") -> None:
        name = MAV_MISSION_RESULT_NAMES.get(result, str(result))
        where = "" if seq is None else f" at {item_label(mission_type, seq)}"
        detail = f": {why}" if why else ""
        super().__init__(
            protocol, f"{mission_type_name(mission_type)} rejected{where}: MAV_MISSION_RESULT {result} ({name}){detail}"
        )
        self.result = result
        self.mission_type = mission_type
        self.seq = seq


class MissionTimeout(ProtocolError):
    """The vehicle stopped answering; `stage` says what we were waiting for."""

    def __init__(self, protocol: str, stage: str, retries: int) -> None:
        super().__init__(protocol, f"no answer while waiting for {stage} after {retries} retries")
        self.stage = stage
        self.retries = retries


@dataclass(frozen=True, kw_only=True, slots=True)
class MissionConfig:
    """Timeouts and retry bounds of the mission protocol."""

    item_timeout_s: float = 1.0
    max_retries: int = 5  # consecutive timeouts without progress

    def __post_init__(self) -> None:
        if not (0 < self.item_timeout_s <= 60):
            raise ConfigError("mission.item_timeout_s", f"must be in (0, 60], got {self.item_timeout_s}")
        if not (0 <= self.max_retries <= 50):
            raise ConfigError("mission.max_retries", f"must be in [0, 50], got {self.max_retries}")


@dataclass(frozen=True, kw_only=True, slots=True)
class MissionItem:
    """One MISSION_ITEM_INT. `x`/`y` are degrees * 1e7 in global frames."""

    seq: int
    frame: int
    command: int
    current: int = 0
    autocontinue: int = 1
    param1: float = 0.0
    param2: float = 0.0
    param3: float = 0.0
    param4: float = 0.0
    x: int = 0
    y: int = 0
    z: float = 0.0
    mission_type: int = MISSION

    def to_message(self, target_system: int, target_component: int) -> MavMessage:
        return mavlink2.MAVLink_mission_item_int_message(
            target_system, target_component, self.seq, self.frame, self.command, self.current,
            self.autocontinue, self.param1, self.param2, self.param3, self.param4,
            self.x, self.y, self.z, self.mission_type,
        )  # fmt: skip

    @classmethod
    def from_message(cls, msg: MavMessage) -> MissionItem:
        """From MISSION_ITEM_INT, or legacy MISSION_ITEM (float degrees in global frames)."""
        frame = int(msg.frame)
        if msg.get_type() == "MISSION_ITEM":
            scale = 1e7 if frame in GLOBAL_FRAMES else 1.0
            x = 0 if math.isnan(msg.x) else round(float(msg.x) * scale)
            y = 0 if math.isnan(msg.y) else round(float(msg.y) * scale)
        else:
            x, y = int(msg.x), int(msg.y)
        return cls(
            seq=int(msg.seq),
            frame=frame,
            command=int(msg.command),
            current=int(msg.current),
            autocontinue=int(msg.autocontinue),
            param1=float(msg.param1),
            param2=float(msg.param2),
            param3=float(msg.param3),
            param4=float(msg.param4),
            x=x,
            y=y,
            z=float(msg.z),
            mission_type=int(getattr(msg, "mission_type", MISSION)),
        )

    def as_dict(self) -> dict[str, int | float]:
        return {
            "seq": self.seq, "frame": self.frame, "command": self.command, "current": self.current,
            "autocontinue": self.autocontinue, "param1": self.param1, "param2": self.param2,
            "param3": self.param3, "param4": self.param4, "x": self.x, "y": self.y, "z": self.z,
            "mission_type": self.mission_type,
        }  # fmt: skip

    def canonical(self) -> tuple[int | float | str, ...]:
        """What survives a round trip through a vehicle: float32 floats, NaN as a token, no `current`."""

        def f(v: float) -> float | str:
            v32 = to_float32(v)
            return "nan" if math.isnan(v32) else v32

        return (
            self.mission_type, self.seq, self.frame, self.command, 1 if self.autocontinue else 0,
            f(self.param1), f(self.param2), f(self.param3), f(self.param4), self.x, self.y, f(self.z),
        )  # fmt: skip


class TransferState(enum.Enum):
    IDLE = "idle"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


@dataclass(slots=True)
class _Transfer:
    """Resend-on-timeout skeleton shared by the three mission machines."""

    target_system: int
    target_component: int
    mission_type: int = MISSION
    config: MissionConfig = field(default_factory=MissionConfig)
    state: TransferState = TransferState.IDLE
    next_deadline: float | None = None
    error: ProtocolError | None = None
    retries: int = 0  # consecutive timeouts
    resends: int = 0  # total timeouts answered by a resend
    ignored: int = 0  # messages of this protocol that answered nothing we asked
    _last: MavMessage = None
    _stage: str = ""

    PROTOCOL = "mission"

    @property
    def done(self) -> bool:
        return self.state in (TransferState.DONE, TransferState.FAILED)

    @property
    def ok(self) -> bool:
        return self.state is TransferState.DONE

    def _send(self, msg: MavMessage, now: float, stage: str) -> list[MavMessage]:
        self._last = msg
        self._stage = stage
        self.next_deadline = now + self.config.item_timeout_s
        return [msg]

    def _progress(self) -> None:
        self.retries = 0

    def _fail(self, error: ProtocolError) -> None:
        self.state = TransferState.FAILED
        self.error = error
        self.next_deadline = None

    def _succeed(self) -> None:
        self.state = TransferState.DONE
        self.next_deadline = None

    def _from_target(self, msg: MavMessage) -> bool:
        if msg.get_srcSystem() != self.target_system:
            return False
        return int(getattr(msg, "mission_type", MISSION)) == self.mission_type

    def on_tick(self, now: float) -> list[MavMessage]:
        if self.state is not TransferState.RUNNING or self.next_deadline is None or now < self.next_deadline:
            return []
        if self.retries >= self.config.max_retries:
            self._fail(MissionTimeout(self.PROTOCOL, self._stage, self.retries))
            return []
        self.retries += 1
        self.resends += 1
        return self._send(self._last, now, self._stage)

    def _check_ack(self, msg: MavMessage, seq: int | None = None) -> bool:
        """Handle a MISSION_ACK that ends the transfer early; True when consumed."""
        if int(msg.type) != MAV_MISSION_ACCEPTED:
            self._fail(MissionRejected(self.PROTOCOL, int(msg.type), self.mission_type, seq=seq))
            return True
        return False


@dataclass(slots=True)
class MissionUpload(_Transfer):
    """MISSION_COUNT, then MISSION_ITEM_INT for each request, until MISSION_ACK."""

    items: tuple[MissionItem, ...] = ()
    highest_sent: int = -1
    PROTOCOL = "mission_upload"

    def __post_init__(self) -> None:
        if len(self.items) > MAX_ITEMS:
            raise ProtocolError(self.PROTOCOL, f"{len(self.items)} items exceed {MAX_ITEMS}")
        fixed: list[MissionItem] = []
        for i, item in enumerate(self.items):
            if item.seq != i:
                raise ProtocolError(self.PROTOCOL, f"item {i} has seq {item.seq}: items must be numbered 0..n-1")
            fixed.append(item if item.mission_type == self.mission_type else replace(item, mission_type=self.mission_type))
        self.items = tuple(fixed)

    def start(self, now: float) -> list[MavMessage]:
        if self.state is not TransferState.IDLE:
            raise RuntimeError("MissionUpload.start called twice")
        self.state = TransferState.RUNNING
        count = mavlink2.MAVLink_mission_count_message(
            self.target_system, self.target_component, len(self.items), self.mission_type
        )
        return self._send(count, now, "MISSION_REQUEST_INT 0" if self.items else "MISSION_ACK")

    @property
    def awaiting_final_ack(self) -> bool:
        return bool(self.items) and self.highest_sent == len(self.items) - 1

    def on_tick(self, now: float) -> list[MavMessage]:
        """Resend on timeout, except the final item.

        Resending the final item after a lost MISSION_ACK makes ArduPilot
        answer the stray item with MISSION_ACK(ERROR) although the mission
        was stored. A lost final item is re-requested by the vehicle itself,
        so in that stage the machine only waits (two timeouts) and then fails
        with stage "MISSION_ACK": the outcome is unknown, and a download
        (`transfers.upload_and_verify`) settles it.
        """
        if not self.awaiting_final_ack:
            return _Transfer.on_tick(self, now)
        if self.state is not TransferState.RUNNING or self.next_deadline is None or now < self.next_deadline:
            return []
        if self.retries >= min(self.config.max_retries, 1):
            self._fail(MissionTimeout(self.PROTOCOL, "MISSION_ACK", self.retries))
            return []
        self.retries += 1
        self.next_deadline = now + self.config.item_timeout_s
        return []

    def on_message(self, msg: MavMessage, now: float) -> list[MavMessage]:
        if self.state is not TransferState.RUNNING:
            return []
        mtype = msg.get_type()
        if mtype not in ("MISSION_REQUEST_INT", "MISSION_REQUEST", "MISSION_ACK") or not self._from_target(msg):
            return []
        if mtype == "MISSION_ACK":
            # An error ACK answers the item just sent: ArduPilot checks each item as it arrives.
            if self._check_ack(msg, self.highest_sent if self.highest_sent >= 0 else None):
                return []
            if self.highest_sent == len(self.items) - 1:
                self._succeed()
            else:
                # ACCEPTED before it asked for every item: the vehicle lost track.
                self._fail(
                    ProtocolError(self.PROTOCOL, f"ACK accepted after {self.highest_sent + 1} of {len(self.items)} items")
                )
            return []
        seq = int(msg.seq)
        if seq >= len(self.items):
            self._fail(ProtocolError(self.PROTOCOL, f"vehicle requested item {seq} of {len(self.items)}"))
            return []
        if seq > self.highest_sent + 1:
            self.ignored += 1  # out of sequence: never send items the vehicle skipped to
            return []
        if seq == self.highest_sent + 1:
            self.highest_sent = seq
        # seq <= highest_sent: our item was lost; answer again. Either way the
        # vehicle is alive and driving the upload, so the retry count resets.
        self._progress()
        item = self.items[seq].to_message(self.target_system, self.target_component)
        stage = "MISSION_ACK" if seq == len(self.items) - 1 else f"MISSION_REQUEST_INT {seq + 1}"
        return self._send(item, now, stage)


@dataclass(slots=True)
class MissionDownload(_Transfer):
    """MISSION_REQUEST_LIST → MISSION_COUNT → MISSION_REQUEST_INT each → MISSION_ACK."""

    count: int | None = None
    items: list[MissionItem] = field(default_factory=list)
    PROTOCOL = "mission_download"

    def start(self, now: float) -> list[MavMessage]:
        if self.state is not TransferState.IDLE:
            raise RuntimeError("MissionDownload.start called twice")
        self.state = TransferState.RUNNING
        req = mavlink2.MAVLink_mission_request_list_message(self.target_system, self.target_component, self.mission_type)
        return self._send(req, now, "MISSION_COUNT")

    def _request(self, seq: int, now: float) -> list[MavMessage]:
        req = mavlink2.MAVLink_mission_request_int_message(
            self.target_system, self.target_component, seq, self.mission_type
        )
        return self._send(req, now, f"MISSION_ITEM_INT {seq}")

    def _finish(self) -> list[MavMessage]:
        self._succeed()
        return [
            mavlink2.MAVLink_mission_ack_message(
                self.target_system, self.target_component, MAV_MISSION_ACCEPTED, self.mission_type
            )
        ]

    def on_message(self, msg: MavMessage, now: float) -> list[MavMessage]:
        if self.state is not TransferState.RUNNING:
            return []
        mtype = msg.get_type()
        if mtype not in ("MISSION_COUNT", "MISSION_ITEM_INT", "MISSION_ITEM", "MISSION_ACK") or not self._from_target(msg):
            return []
        if mtype == "MISSION_ACK":
            # A vehicle may abort a download with an error ACK.
            if not self._check_ack(msg):
                self.ignored += 1
            return []
        if mtype == "MISSION_COUNT":
            if self.count is not None:
                if int(msg.count) != self.count:
                    self._fail(ProtocolError(self.PROTOCOL, f"count changed from {self.count} to {msg.count}"))
                else:
                    self.ignored += 1  # answer to a resent REQUEST_LIST
                return []
            self.count = int(msg.count)
            self._progress()
            if self.count == 0:
                return self._finish()
            return self._request(0, now)
        if self.count is None:
            self.ignored += 1
            return []
        seq = int(msg.seq)
        if seq != len(self.items):
            self.ignored += 1  # a duplicate or an item we did not ask for
            return []
        self.items.append(MissionItem.from_message(msg))
        self._progress()
        if len(self.items) == self.count:
            return self._finish()
        return self._request(len(self.items), now)


@dataclass(slots=True)
class MissionClear(_Transfer):
    """MISSION_CLEAR_ALL, resent until MISSION_ACK."""

    PROTOCOL = "mission_clear"

    def start(self, now: float) -> list[MavMessage]:
        if self.state is not TransferState.IDLE:
            raise RuntimeError("MissionClear.start called twice")
        self.state = TransferState.RUNNING
        msg = mavlink2.MAVLink_mission_clear_all_message(self.target_system, self.target_component, self.mission_type)
        return self._send(msg, now, "MISSION_ACK")

    def on_message(self, msg: MavMessage, now: float) -> list[MavMessage]:
        if self.state is not TransferState.RUNNING or msg.get_type() != "MISSION_ACK" or not self._from_target(msg):
            return []
        if not self._check_ack(msg):
            self._succeed()
        return []
