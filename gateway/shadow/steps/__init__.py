"""One step per desired field: params, mission, geofence, rates, mode, armed.

Each step has a pure `observe()` (the diff, unit-tested, the very code a pass
runs) and an `apply()` (the MAVLink I/O through the vehicle's `Session`),
and all of them write one `RetryBook` (mavjet.gateway.shadow.book).
"""

from __future__ import annotations

from mavjet.gateway.shadow.steps.base import Finding, Step, StepContext, Verdict
from mavjet.gateway.shadow.steps.flight import FlightStep, FlightTracker
from mavjet.gateway.shadow.steps.geofence import GeofenceStep
from mavjet.gateway.shadow.steps.mission import MissionStep
from mavjet.gateway.shadow.steps.params import ParamsStep
from mavjet.gateway.shadow.steps.rates import RatesStep

__all__ = [
    "Finding", "FlightStep", "FlightTracker", "GeofenceStep", "MissionStep", "ParamsStep", "RatesStep", "Step",
    "StepContext", "Verdict",
]
