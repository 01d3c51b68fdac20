"""Autopilot flavours and their flight-mode tables: `mavjet.contract.modes`, re-exported.

The tables and the flavour rules are written once, in the contract, so that
analytics (which may import only the contract) decodes a mode as the
gateway does; the drivers and the gateway keep importing them from here.
"""

from __future__ import annotations

from mavjet.contract.modes import (
    ARDUCOPTER_MODES,
    ARDUPILOT_TAKEOFF_MODES,
    ARDUPLANE_MODES,
    ARDUROVER_MODES,
    PX4_AUTO_SUB_MODES,
    PX4_MAIN_MODES,
    RECOVERY_MODES,
    Flavour,
    ModeTable,
    UnknownMode,
    VehicleClass,
    canonical_mode,
    flavour_of,
    px4_pack,
    px4_unpack,
    table_for,
    vehicle_class_of,
)

__all__ = [
    "ARDUCOPTER_MODES",
    "ARDUPILOT_TAKEOFF_MODES",
    "ARDUPLANE_MODES",
    "ARDUROVER_MODES",
    "PX4_AUTO_SUB_MODES",
    "PX4_MAIN_MODES",
    "RECOVERY_MODES",
    "Flavour",
    "ModeTable",
    "UnknownMode",
    "VehicleClass",
    "canonical_mode",
    "flavour_of",
    "px4_pack",
    "px4_unpack",
    "table_for",
    "vehicle_class_of",
]
