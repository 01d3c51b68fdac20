"""Arming as a real ArduCopter reports it (recordings boot_and_arm_refused*): reasons after the ACK, periodic PreArm."""

from __future__ import annotations

import asyncio

from pymavlink.dialects.v20 import ardupilotmega as M

from tests.support.sim import MavClient, running

ARM = M.MAV_CMD_COMPONENT_ARM_DISARM


async def test_refused_arm_sends_its_arm_reason_after_the_ack() -> None:
    async with running(ekf_settle_s=60.0, speedup=20.0) as fleet:
        gcs = await MavClient.connect(fleet.endpoints[0])
        try:
            await asyncio.sleep(0.2)  # past the GPS fix: the failing check is the EKF's
            i = gcs.mark()
            ack = await gcs.command_long(1, ARM, 1)
            assert ack.result == M.MAV_RESULT_FAILED
            after = await gcs.recv("STATUSTEXT", lambda m: m.text.startswith("Arm: "), since=i)
            seen = [m for m in gcs.messages[i:] if m.get_type() in ("STATUSTEXT", "COMMAND_ACK")]
            k_ack = next(n for n, m in enumerate(seen) if m.get_type() == "COMMAND_ACK")
            k_arm = next(n for n, m in enumerate(seen) if m is after)
            assert k_arm > k_ack  # "Arm: ..." follows the ACK, as on ArduPilot
            assert k_ack == 0  # and nothing before it: "PreArm: ..." is only the periodic display
            assert after.severity == M.MAV_SEVERITY_CRITICAL
            assert after.text == "Arm: EKF3 still initialising"
        finally:
            await gcs.close()


async def test_a_failing_prearm_check_is_printed_every_30_s_of_vehicle_time() -> None:
    # 20x: 30 s of vehicle time is 1.5 s of wall time. The EKF never settles in this test.
    async with running(ekf_settle_s=1e6, speedup=20.0) as fleet:
        gcs = await MavClient.connect(fleet.endpoints[0])
        try:
            v = fleet.vehicles[0]
            first = await gcs.recv("STATUSTEXT", lambda m: m.text.startswith("PreArm: "), timeout_s=5)
            t1 = v.now
            second = await gcs.recv("STATUSTEXT", lambda m: m.text.startswith("PreArm: "), timeout_s=5)
            t2 = v.now
            assert first.text == second.text == "PreArm: EKF3 still initialising"
            assert 25.0 <= t2 - t1 <= 35.0, (t1, t2)
            assert 28.0 <= t1 - v.boot_at <= 35.0
            assert not v.armed
        finally:
            await gcs.close()
