"""ParamSet / ParamRead fed with crafted PARAM_VALUE messages (no I/O)."""

from __future__ import annotations

import math

import pytest

from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.drivers.mavlink.params import (
    REAL32,
    ParamConfig,
    ParamEncoding,
    ParamError,
    ParamMismatch,
    ParamTimeout,
    decode_param_value,
    encode_param_id,
    encode_param_value,
    make_param_read,
    make_param_set,
    values_equal,
)
from tests.drivers.helpers import wire

INT8 = mavlink2.MAV_PARAM_TYPE_INT8
INT32 = mavlink2.MAV_PARAM_TYPE_INT32
CFG = ParamConfig(timeout_s=1.0, max_attempts=3)


def pv(name: str, value: float, ptype: int = REAL32, sysid: int = 1) -> object:
    return wire(mavlink2.MAVLink_param_value_message(name.encode(), value, ptype, 900, 12), sysid=sysid)


def test_param_id_encoding() -> None:
    assert encode_param_id("WPNAV_SPEED") == b"WPNAV_SPEED"
    assert encode_param_id("A" * 16) == b"A" * 16
    with pytest.raises(ParamError, match="16"):
        encode_param_id("A" * 17)
    with pytest.raises(ParamError):
        encode_param_id("")
    with pytest.raises(ParamError):
        encode_param_id("WPNAV_SPÉED")


def test_sixteen_char_id_round_trips_without_padding() -> None:
    name = "ABCDEFGHIJKLMNOP"
    m = make_param_read(name, target_system=1, target_component=1, config=CFG)
    m.start(0.0)
    m.on_message(pv(name, 3.0), 0.1)
    assert m.result is not None and m.result.name == name and m.result.value == 3.0


def test_set_real_confirmed_within_float32_tolerance() -> None:
    m = make_param_set("WPNAV_SPEED", 512.3, REAL32, target_system=1, target_component=1, config=CFG)
    out = m.start(0.0)
    assert out[0].get_type() == "PARAM_SET" and out[0].param_id == "WPNAV_SPEED"
    assert out[0].param_type == REAL32
    m.on_message(pv("WPNAV_SPEED", 512.3), 0.05)  # float32-rounded on the wire
    assert m.done and m.error is None and m.result is not None
    assert m.result.value == pytest.approx(512.3, rel=1e-6) and m.result.index == 12


def test_set_ignores_other_ids_and_vehicles_and_resends_on_timeout() -> None:
    m = make_param_set("RTL_ALT", 1500, INT32, target_system=1, target_component=1, config=CFG)
    m.start(0.0)
    m.on_message(pv("RTL_ALT_FINAL", 1500, INT32), 0.1)
    m.on_message(pv("RTL_ALT", 1500, INT32, sysid=2), 0.2)
    assert not m.done
    resent = m.on_tick(1.0)
    assert len(resent) == 1 and resent[0].param_value == 1500.0 and m.attempts == 2
    m.on_message(pv("RTL_ALT", 1500, INT32), 1.1)
    assert m.result is not None and m.result.value == 1500.0


def test_set_stale_value_resends_then_mismatch() -> None:
    m = make_param_set("RTL_ALT", 1500, INT32, target_system=1, target_component=1, config=CFG)
    m.start(0.0)
    out = m.on_message(pv("RTL_ALT", 1200, INT32), 0.1)  # a broadcast that crossed our set
    assert len(out) == 1 and m.attempts == 2 and not m.done
    m.on_message(pv("RTL_ALT", 1200, INT32), 0.2)
    assert m.attempts == 3
    m.on_message(pv("RTL_ALT", 1200, INT32), 0.3)
    assert isinstance(m.error, ParamMismatch)
    assert m.error.reported == 1200.0 and m.error.wanted == 1500 and m.error.attempts == 3


def test_set_times_out() -> None:
    m = make_param_set("NOPE", 1.0, REAL32, target_system=1, target_component=1, config=CFG)
    m.start(0.0)
    m.on_tick(1.0)
    m.on_tick(2.0)
    assert not m.done
    m.on_tick(3.0)
    assert isinstance(m.error, ParamTimeout) and m.error.attempts == 3 and m.error.name == "NOPE"


def test_read_by_name() -> None:
    m = make_param_read("FENCE_ENABLE", target_system=1, target_component=1, config=CFG)
    out = m.start(0.0)
    assert out[0].get_type() == "PARAM_REQUEST_READ" and out[0].param_index == -1
    m.on_message(pv("FENCE_ENABLE", 1, INT8), 0.3)
    assert m.result is not None and m.result.param_type == INT8 and m.result.value == 1.0


def test_int_value_validation() -> None:
    with pytest.raises(ParamError, match="integer"):
        make_param_set("RTL_ALT", 1.5, INT32, target_system=1, target_component=1)
    with pytest.raises(ParamError, match="range"):
        make_param_set("FENCE_ENABLE", 300, INT8, target_system=1, target_component=1)


def test_tolerance_rules() -> None:
    assert values_equal(0.1, 0.10000000149, REAL32)
    assert not values_equal(0.1, 0.1001, REAL32)
    assert values_equal(5, 5.0, INT32)
    assert not values_equal(5, 6, INT32)
    assert values_equal(math.nan, math.nan, REAL32)


@pytest.mark.parametrize("value", [0, 1, -1, 127, -128])
def test_bytewise_encoding_round_trip(value: int) -> None:
    wire_value = encode_param_value(value, INT8, ParamEncoding.BYTEWISE)
    assert decode_param_value(wire_value, INT8, ParamEncoding.BYTEWISE) == value
    assert encode_param_value(value, INT8, ParamEncoding.CAST) == float(value)


def test_bytewise_int32_is_not_a_cast() -> None:
    wire_value = encode_param_value(1, INT32, ParamEncoding.BYTEWISE)
    assert wire_value != 1.0  # 1 as int32 bytes is a denormal float
    assert decode_param_value(wire_value, INT32, ParamEncoding.BYTEWISE) == 1.0
