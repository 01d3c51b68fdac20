"""The command catalogue (contract), preconditions and MAV_CMD mapping, fed with plain dicts and bytes (no I/O)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import msgpack
import pytest

from mavjet.contract.commands import (
    CATALOGUE,
    Command,
    CommandInvalid,
    decode_command,
    encode_command,
    parse_cli_params,
    result_data,
    validate_params,
)
from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.drivers.mavlink.modes import Flavour, ModeTable, VehicleClass
from mavjet.gateway.commands.preconditions import check_mode
from mavjet.gateway.commands.spec import mav_action, precondition_failure

COPTER = ModeTable(flavour=Flavour.ARDUPILOT, vehicle_class=VehicleClass.COPTER)
PX4 = ModeTable(flavour=Flavour.PX4, vehicle_class=VehicleClass.COPTER)
MAX = 64 * 1024


def body(cmd_id: str = "c1", params: dict[str, object] | None = None, **kw: object) -> bytes:
    now = time.time_ns()
    return encode_command(cmd_id, params or {}, issued_ns=now, **kw)  # type: ignore[arg-type]


def reason(name: str, payload: bytes) -> str:
    with pytest.raises(CommandInvalid) as exc:
        decode_command(name, payload, max_payload_bytes=MAX, fallback_id="hdr-id")
    return exc.value.reason


# -- the catalogue --------------------------------------------------------

def test_catalogue_has_every_command_of_the_issue() -> None:
    assert set(CATALOGUE) == {
        "arm", "disarm", "takeoff", "land", "rtl", "set_mode", "goto", "param_set", "param_get",
        "mission_upload", "mission_clear", "mission_start", "mission_download", "reboot", "log_download", "log_list",
    }


@pytest.mark.parametrize(
    ("name", "params", "expected"),
    [
        ("takeoff", {"alt_m": 900}, "takeoff: alt_m 900 outside [1, 500] m"),
        ("takeoff", {"alt_m": 0.5}, "takeoff: alt_m 0.5 outside [1, 500] m"),
        ("takeoff", {}, "takeoff: missing parameter 'alt_m' (allowed: alt_m)"),
        ("takeoff", {"alt_m": "high"}, "takeoff: alt_m must be a number, got str 'high'"),
        ("takeoff", {"alt_m": True}, "takeoff: alt_m must be a number, got bool True"),
        ("takeoff", {"alt_m": math.nan}, "takeoff: alt_m must be finite, got nan"),
        ("takeoff", {"alt_m": 10, "speed": 3}, "takeoff: unknown parameter 'speed' (allowed: alt_m)"),
        ("goto", {"lat_deg": 91, "lon_deg": 0, "alt_m": 10}, "goto: lat_deg 91 outside [-90, 90] deg"),
        ("goto", {"lat_deg": 0, "lon_deg": -181, "alt_m": 10}, "goto: lon_deg -181 outside [-180, 180] deg"),
        ("param_set", {"name": "rtl_alt", "value": 1},
         "param_set: name 'rtl_alt' is not a parameter name (1-16 characters A-Z, 0-9, _)"),
        ("param_set", {"name": "A" * 17, "value": 1},
         f"param_set: name '{'A' * 17}' is not a parameter name (1-16 characters A-Z, 0-9, _)"),
        ("param_get", {"name": 5}, "param_get: name must be a string, got int 5"),
        ("disarm", {"force": 1}, "disarm: force must be true or false, got 1"),
        ("land", {"alt_m": 3}, "land: unknown parameter 'alt_m' (it takes no parameters)"),
        ("mission_upload", {"object": "../etc/passwd"},
         "mission_upload: object '../etc/passwd' is not an object name in TWIN_BLOBS (e.g. missions/survey.plan)"),
    ],
)
def test_bad_params_say_what_is_wrong(name: str, params: dict[str, object], expected: str) -> None:
    with pytest.raises(CommandInvalid) as exc:
        validate_params(name, params)
    assert exc.value.reason == expected
    assert exc.value.name == name


def test_good_params_are_normalised_with_defaults() -> None:
    assert validate_params("takeoff", {"alt_m": 20}) == {"alt_m": 20.0}
    assert validate_params("disarm", {}) == {"force": False}
    assert validate_params("param_set", {"name": "RTL_ALT", "value": 1500}) == {"name": "RTL_ALT", "value": 1500.0}
    assert validate_params("goto", {"lat_deg": -35.36, "lon_deg": 149.16, "alt_m": 500}) == {
        "lat_deg": -35.36, "lon_deg": 149.16, "alt_m": 500.0,
    }


def test_unknown_command_lists_known_ones() -> None:
    with pytest.raises(CommandInvalid) as exc:
        validate_params("selfdestruct", {})
    assert exc.value.reason.startswith("unknown command 'selfdestruct' (known: arm, disarm, takeoff")


def test_cli_params_are_typed() -> None:
    assert parse_cli_params("takeoff", ["alt_m=20"]) == {"alt_m": 20.0}
    assert parse_cli_params("disarm", ["force=yes"]) == {"force": True}
    assert parse_cli_params("param_set", ["name=RTL_ALT", "value=1500"]) == {"name": "RTL_ALT", "value": 1500.0}
    with pytest.raises(CommandInvalid, match="--param expects key=value"):
        parse_cli_params("takeoff", ["alt_m"])
    with pytest.raises(CommandInvalid, match="alt_m must be a number, got 'x'"):
        parse_cli_params("takeoff", ["alt_m=x"])
    with pytest.raises(CommandInvalid, match="alt_m 600 outside"):
        parse_cli_params("takeoff", ["alt_m=600"])


# -- the body --------------------------------------------------------------

def test_body_round_trip() -> None:
    now = time.time_ns()
    payload = encode_command("id-1", {"alt_m": 12.5}, issued_ns=now, deadline_ns=now + 30 * 10**9, issuer="ops")
    cmd = decode_command("takeoff", payload, max_payload_bytes=MAX)
    assert cmd == Command(cmd_id="id-1", name="takeoff", issued_ns=now, deadline_ns=now + 30 * 10**9,
                          params={"alt_m": 12.5}, issuer="ops")
    assert not cmd.expired(now + 29 * 10**9)
    assert cmd.expired(now + 31 * 10**9)
    raw = msgpack.unpackb(payload)
    assert set(raw) == {"id", "issued", "deadline", "params", "issuer"}
    assert isinstance(raw["issued"], msgpack.Timestamp)


def test_no_deadline_never_expires() -> None:
    cmd = decode_command("land", body(), max_payload_bytes=MAX)
    assert cmd.deadline_ns is None and not cmd.expired(time.time_ns() + 10**15)


def test_bad_bodies() -> None:
    assert reason("land", b"\xc1\xff garbage").startswith("land: body is not msgpack")
    assert reason("land", msgpack.packb([1, 2])) == "land: body must be a msgpack map, got list"
    assert reason("land", msgpack.packb({"issued": 1})) == "land: 'id' must be a string of 1-128 characters"
    assert reason("land", msgpack.packb({"id": "x"})) == "land: 'issued' is missing"
    assert reason("land", msgpack.packb({"id": "x", "issued": 5})) == "land: 'issued' must be a msgpack Timestamp, got int"
    ts = msgpack.Timestamp.from_unix_nano(time.time_ns())
    assert reason("land", msgpack.packb({"id": "x", "issued": ts, "extra": 1})) == "land: unknown body keys ['extra']"
    assert reason("land", msgpack.packb({"id": "x", "issued": ts, "params": [1]})) == "land: 'params' must be a map, got list"


def test_invalid_keeps_the_id_it_could_read() -> None:
    with pytest.raises(CommandInvalid) as exc:
        decode_command("takeoff", body("my-id", {"alt_m": 1000}), max_payload_bytes=MAX, fallback_id="hdr")
    assert exc.value.cmd_id == "my-id"
    with pytest.raises(CommandInvalid) as exc:
        decode_command("takeoff", b"\x00\x01", max_payload_bytes=MAX, fallback_id="hdr")
    assert exc.value.cmd_id == "hdr"


def test_oversize_payload() -> None:
    big = body("big", {"name": "X" * 10})
    with pytest.raises(CommandInvalid) as exc:
        decode_command("param_get", big + b"\x00" * 2000, max_payload_bytes=1024, fallback_id="hdr")
    assert "exceeds the 1024-byte limit" in exc.value.reason
    assert exc.value.cmd_id == "hdr"


# -- preconditions -------------------------------------------------------------

@dataclass
class State:
    armed: bool | None = False
    mode: str | None = "GUIDED"
    failsafe_active: bool = False
    landed_state: int | None = mavlink2.MAV_LANDED_STATE_ON_GROUND
    flavour: str = "ardupilot"
    vehicle_class: str = "copter"
    modes: ModeTable | None = COPTER


def cmd(cmd_name: str, **params: object) -> Command:
    return Command(cmd_id="c", name=cmd_name, issued_ns=0, deadline_ns=None, params=validate_params(cmd_name, params))


def test_takeoff_preconditions() -> None:
    assert precondition_failure(cmd("takeoff", alt_m=10), State(armed=False)) == "takeoff needs the vehicle armed"
    assert precondition_failure(cmd("takeoff", alt_m=10), State(armed=True, mode="LOITER")) == (
        "takeoff needs mode GUIDED, the vehicle is in LOITER"
    )
    airborne = State(armed=True, landed_state=mavlink2.MAV_LANDED_STATE_IN_AIR)
    assert precondition_failure(cmd("takeoff", alt_m=10), airborne) == "takeoff refused: the vehicle is already in the air"
    assert precondition_failure(cmd("takeoff", alt_m=10), State(armed=True)) is None
    px4 = State(armed=True, mode="POSCTL", flavour="px4", modes=PX4)
    assert precondition_failure(cmd("takeoff", alt_m=10), px4) is None


def test_reboot_needs_disarmed() -> None:
    assert precondition_failure(cmd("reboot"), State(armed=True)) == "reboot needs the vehicle disarmed"
    assert precondition_failure(cmd("reboot"), State(armed=False)) is None


def test_failsafe_allows_only_recovery() -> None:
    fs = State(armed=True, mode="RTL", failsafe_active=True, landed_state=mavlink2.MAV_LANDED_STATE_IN_AIR)
    for name, params in (("goto", {"lat_deg": 1, "lon_deg": 1, "alt_m": 10}), ("set_mode", {"mode": "GUIDED"}),
                         ("mission_start", {}), ("arm", {})):
        failure = precondition_failure(cmd(name, **params), fs)
        assert failure is not None and "failsafe is active" in failure, name
    for name in ("land", "rtl", "disarm", "param_get"):
        params = {"name": "RTL_ALT"} if name == "param_get" else {}
        assert precondition_failure(cmd(name, **params), fs) is None, name
    assert precondition_failure(cmd("set_mode", mode="LAND"), fs) is None  # a recovery mode


def test_mode_checked_against_the_vehicle_table() -> None:
    assert check_mode("guided", COPTER) == "GUIDED"
    with pytest.raises(CommandInvalid, match="unknown mode 'POSCTL'; this vehicle knows STABILIZE"):
        check_mode("POSCTL", COPTER)
    assert check_mode("AUTO.MISSION", PX4) == "AUTO.MISSION"


# -- MAVLink mapping -------------------------------------------------------------

def test_mav_actions() -> None:
    a = mav_action(cmd("arm"), COPTER)
    assert (a.command, a.params) == (mavlink2.MAV_CMD_COMPONENT_ARM_DISARM, (1.0,))
    assert mav_action(cmd("disarm", force=True), COPTER).params == (0.0, 21196.0)
    t = mav_action(cmd("takeoff", alt_m=25), COPTER)
    assert t.command == mavlink2.MAV_CMD_NAV_TAKEOFF and t.params[6] == 25.0
    m = mav_action(cmd("set_mode", mode="GUIDED"), COPTER)
    assert (m.command, m.params) == (mavlink2.MAV_CMD_DO_SET_MODE, (1.0, 4.0))
    p = mav_action(cmd("set_mode", mode="AUTO.MISSION"), PX4)
    assert p.params == (1.0, 4.0, 4.0)
    g = mav_action(cmd("goto", lat_deg=-35.1, lon_deg=149.2, alt_m=30), COPTER)
    assert g.use_int and g.command == mavlink2.MAV_CMD_DO_REPOSITION and g.params[4:] == (-35.1, 149.2, 30.0)
    assert g.frame == mavlink2.MAV_FRAME_GLOBAL_RELATIVE_ALT_INT
    assert mav_action(cmd("reboot"), COPTER).command == mavlink2.MAV_CMD_PREFLIGHT_REBOOT_SHUTDOWN
    assert mav_action(cmd("mission_start"), COPTER).command == mavlink2.MAV_CMD_MISSION_START


def test_result_data_fields() -> None:
    d = result_data(cmd_id="c", name="arm", result="accepted", mav_result=0, attempts=1, latency_ms=-3)
    assert d == {"cmd_id": "c", "name": "arm", "result": "accepted", "mav_result": 0, "detail": "",
                 "attempts": 1, "latency_ms": 0.0}
    with pytest.raises(ValueError, match="unknown cmd_result"):
        result_data(cmd_id="c", name="arm", result="ok")


def test_log_ids_from_0_as_px4_numbers_them() -> None:
    from mavjet.contract.commands import CommandInvalid, validate_params

    assert validate_params("log_download", {"log": "0"})["log"] == "0"
    assert validate_params("log_download", {"log": "65535"})["log"] == "65535"
    for bad in ("00", "-1", "123456", "newest"):
        with pytest.raises(CommandInvalid):
            validate_params("log_download", {"log": bad})


def test_latest_log_is_the_newest_by_its_start_else_the_highest_id() -> None:
    from mavjet.drivers.mavlink.logs import LogEntry
    from mavjet.gateway.commands.actions import pick_log

    def e(log_id: int, t: int) -> LogEntry:
        return LogEntry(log_id=log_id, num_logs=3, last_log_num=2, time_utc_s=t, size_bytes=100)

    px4 = [e(0, 1_700_000_300), e(1, 1_700_000_100), e(2, 1_700_000_200)]  # directory order, not time
    picked = pick_log(px4, "latest")
    assert picked is not None and picked.log_id == 0
    ardupilot = [e(1, 0), e(2, 0), e(3, 0)]  # no UTC time: numbered in order
    picked = pick_log(ardupilot, "latest")
    assert picked is not None and picked.log_id == 3
    assert pick_log(px4, "0") is px4[0] and pick_log(px4, "7") is None and pick_log([], "latest") is None
