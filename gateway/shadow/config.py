"""Shadow reconciler settings (`[shadow]` in the gateway's TOML)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from mavjet.contract.errors import ConfigError


@dataclass(frozen=True, slots=True, kw_only=True)
class ShadowConfig:
    enabled: bool = True
    # Level-triggered config is read back from the vehicle this often even when nothing changed.
    verify_interval_s: float = 60.0
    # The desired watch is checked against a direct get this often (missed updates, dead watches).
    resync_interval_s: float = 10.0
    # Capped exponential backoff between attempts on a field that did not take.
    retry_initial_s: float = 1.0
    retry_max_s: float = 60.0
    # `shadow_failed` once a field has failed this many times for a desired revision.
    fail_after_attempts: int = 3
    # Flight state (mode, armed): at most this many attempts per desired revision.
    flight_max_attempts: int = 3
    # After an accepted mode/arm command, wait this long for HEARTBEAT to show it.
    confirm_s: float = 3.0
    # Answers to MAV_CMD_REQUEST_MESSAGE / GET_MESSAGE_INTERVAL.
    request_timeout_s: float = 3.0
    # `reported` is rewritten at least this often (its `updated` shows the gateway is alive).
    report_refresh_s: float = 30.0
    # The reconciler's idle tick: reboot detection and due retries are checked this often.
    tick_s: float = 0.5
    max_conflicts: int = 10

    def __post_init__(self) -> None:
        for f in ("verify_interval_s", "resync_interval_s", "retry_initial_s", "retry_max_s", "confirm_s",
                  "request_timeout_s", "report_refresh_s", "tick_s"):
            if not getattr(self, f) > 0:
                raise ConfigError(f"shadow.{f}", "must be > 0")
        if self.retry_max_s < self.retry_initial_s:
            raise ConfigError("shadow.retry_max_s", "must be >= shadow.retry_initial_s")
        if self.tick_s > 5:
            raise ConfigError("shadow.tick_s", "must be <= 5 s (reboot detection)")
        for f in ("fail_after_attempts", "flight_max_attempts", "max_conflicts"):
            if getattr(self, f) < 1:
                raise ConfigError(f"shadow.{f}", "must be >= 1")

    @classmethod
    def from_toml(cls, raw: Mapping[str, Any]) -> ShadowConfig:
        """Build from the `[shadow]` table, naming the offending key in errors."""
        known = {f.name: f for f in fields(cls)}
        kw: dict[str, Any] = {}
        for k, v in raw.items():
            if k not in known:
                raise ConfigError(f"shadow.{k}", f"unknown key (allowed: {', '.join(sorted(known))})")
            if k == "enabled":
                if not isinstance(v, bool):
                    raise ConfigError("shadow.enabled", "expected true or false")
                kw[k] = v
            elif k in ("fail_after_attempts", "flight_max_attempts", "max_conflicts"):
                if isinstance(v, bool) or not isinstance(v, int):
                    raise ConfigError(f"shadow.{k}", f"expected an integer, got {v!r}")
                kw[k] = v
            else:
                if isinstance(v, bool) or not isinstance(v, int | float):
                    raise ConfigError(f"shadow.{k}", f"expected a number, got {v!r}")
                kw[k] = float(v)
        return cls(**kw)
