"""Whether a simulated fleet runs in step, from the environment: one small module, no MAVLink imports.

The simulator's `--in-step` takes its default from here, and the benchmarks,
which start the simulator as a process, record it with their figures. Through
the environment it also reaches a simulator started by an older build's
benchmark code (`mavjet bench compare`), which passes no simulator options.
"""

from __future__ import annotations

import os

IN_STEP_ENV = "MAVJET_SIM_IN_STEP"


def in_step_from_env() -> bool:
    """True when MAVJET_SIM_IN_STEP is set and not "0"."""
    return os.environ.get(IN_STEP_ENV, "") not in ("", "0")
