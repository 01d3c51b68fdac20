"""MAV_SYSID, as on ArduCopter 4.7 (terrain: tests/sim/test_terrain.py)."""

from __future__ import annotations

from pymavlink.dialects.v20 import ardupilotmega as M

from mavjet.sim.fleet import SimFleet
from tests.support.sim import MavClient


async def test_system_id_is_mav_sysid_without_the_old_name(fleet: SimFleet, gcs: MavClient) -> None:
    i = gcs.mark()
    gcs.send(M.MAVLink_param_request_read_message(1, 1, b"MAV_SYSID", -1))
    pv = await gcs.recv("PARAM_VALUE", lambda m: m.param_id == "MAV_SYSID", since=i)
    assert pv.param_value == 1.0
    gcs.send(M.MAVLink_param_request_read_message(1, 1, b"SYSID_THISMAV", -1))
    gcs.send(M.MAVLink_param_request_read_message(1, 1, b"MAV_GCS_SYSID", -1))
    await gcs.recv("PARAM_VALUE", lambda m: m.param_id == "MAV_GCS_SYSID", since=i)
    assert not [m for m in gcs.of("PARAM_VALUE", i) if m.param_id == "SYSID_THISMAV"]  # unknown in 4.7: no answer
