"""One decoder per vehicle fact read from MAVLink numbers: armed, airborne, past boot, in a failsafe. Pure.

Telemetry (the twin), the command machines, the commands' preconditions,
the operator's sortie and analytics' synthetic history all ask these, so
they cannot disagree on what a HEARTBEAT or an EXTENDED_SYS_STATE says. In
the contract because analytics may import nothing else; the drivers
re-export them (`mavjet.drivers.mavlink.autopilot`). The flight-mode
decoding, per flavour, is `mavjet.contract.modes`.

MAVLink enum values are written as numbers (no pymavlink here);
tests/drivers/test_autopilot.py holds them to pymavlink's dialect.
"""

from __future__ import annotations

#: HEARTBEAT.base_mode bit set while the motors are armed (MAV_MODE_FLAG_SAFETY_ARMED).
MAV_MODE_FLAG_SAFETY_ARMED = 128

# MAV_LANDED_STATE values.
MAV_LANDED_STATE_UNDEFINED = 0
MAV_LANDED_STATE_ON_GROUND = 1
MAV_LANDED_STATE_IN_AIR = 2
MAV_LANDED_STATE_TAKEOFF = 3
MAV_LANDED_STATE_LANDING = 4

# MAV_STATE values (HEARTBEAT.system_status): UNINIT 0, BOOT 1, CALIBRATING 2, STANDBY 3, ACTIVE 4,
# CRITICAL 5, EMERGENCY 6, POWEROFF 7, FLIGHT_TERMINATION 8.
MAV_STATE_STANDBY = 3
MAV_STATE_CRITICAL = 5
MAV_STATE_EMERGENCY = 6

#: MAV_LANDED_STATE values in which the vehicle is off the ground.
#: LANDING belongs here: a vehicle that is descending to land is still flying
#: (it can be told to go around, a takeoff would be nonsense, and a disarm
#: would drop it). Only ON_GROUND (and UNDEFINED: not known) are not airborne.
AIRBORNE_LANDED_STATES: frozenset[int] = frozenset(
    {MAV_LANDED_STATE_IN_AIR, MAV_LANDED_STATE_TAKEOFF, MAV_LANDED_STATE_LANDING}
)

#: HEARTBEAT.system_status values in which the autopilot is in a failsafe.
FAILSAFE_SYSTEM_STATES: frozenset[int] = frozenset({MAV_STATE_CRITICAL, MAV_STATE_EMERGENCY})


def is_armed(base_mode: int) -> bool:
    """The SAFETY_ARMED bit of a HEARTBEAT's base_mode."""
    return bool(base_mode & MAV_MODE_FLAG_SAFETY_ARMED)


def is_airborne(landed_state: int | None) -> bool:
    """True while the vehicle is off the ground (IN_AIR, TAKEOFF or LANDING); False when unknown."""
    return landed_state in AIRBORNE_LANDED_STATES


def is_failsafe_state(system_status: int | None) -> bool:
    """True while HEARTBEAT.system_status says the autopilot is in a failsafe (CRITICAL, EMERGENCY)."""
    return system_status in FAILSAFE_SYSTEM_STATES


def is_past_boot(system_status: int | None) -> bool:
    """True once the autopilot is out of UNINIT/BOOT/CALIBRATING (STANDBY or later); False when unknown.

    ArduPilot reverts a mode set while booting and refuses to arm ("Arm: System not initialised").
    """
    return system_status is not None and system_status >= MAV_STATE_STANDBY
