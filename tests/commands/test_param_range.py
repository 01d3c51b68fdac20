"""`param_set` with a value no float32 can hold ends `invalid`, not `failed`.

A MAVLink PARAM_SET carries a float32: 1e308 cannot be sent at all, so it is
the body's fault (checked by the contract, before anything reaches the
vehicle), like NaN and infinity.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
from nats.aio.client import Client

from mavjet.contract.commands import FLOAT32_MAX, CommandInvalid, encode_command, validate_params
from mavjet.ops.natsserver import NatsServer
from tests.support.commands import command_rig


@pytest.mark.parametrize("value", [1e308, -1e308, 3.5e38, math.nan, math.inf, -math.inf])
def test_value_outside_float32_is_invalid(value: float) -> None:
    with pytest.raises(CommandInvalid) as exc:
        validate_params("param_set", {"name": "RTL_ALT", "value": value})
    assert exc.value.reason.startswith("param_set: value "), exc.value.reason


@pytest.mark.parametrize("value", [FLOAT32_MAX, -FLOAT32_MAX, 0.0, 1500, 3.4e38])
def test_value_inside_float32_is_accepted(value: float) -> None:
    assert validate_params("param_set", {"name": "RTL_ALT", "value": value})["value"] == value


async def test_param_set_1e308_ends_invalid_on_a_running_gateway(
    provisioned: Client, nats_server: NatsServer, tmp_path: Path
) -> None:
    async with command_rig(provisioned, nats_server.url, tmp_path / "state") as rig:
        await rig.link_known("VID-001")
        c = rig.client
        c.expect("huge")
        await c.publish_raw("VID-001", "param_set",
                            encode_command("huge", {"name": "RTL_ALT", "value": 1e308}, issued_ns=time.time_ns()),
                            msg_id="huge")
        result = await c.wait("huge", 15.0)
        assert result.result == "invalid", result
        assert "float32" in result.detail, result
