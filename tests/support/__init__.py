"""Helpers shared by the tests (never fixtures: those stay in conftest modules).

- `wait`: the one bounded wait (`wait_for`, `wait_for_async`).
- `gateway`: a test gateway config, running a gateway in-process, reading events back.
- `commands`, `shadow`, `sim`, `cluster`: the rigs of those test areas.
"""

from tests.support.gateway import ENV, collect_events, gateway_config, running, running_gateway
from tests.support.wait import WaitTimeout, wait_for, wait_for_async

__all__ = [
    "ENV", "WaitTimeout", "collect_events", "gateway_config", "running", "running_gateway", "wait_for", "wait_for_async",
]
