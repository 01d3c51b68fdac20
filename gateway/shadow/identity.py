"""The `config` and `meta` shadow documents, written when a vehicle (re)connects.

`config` is how this gateway serves the vehicle (endpoint, ids, rates);
`meta` is what the vehicle is (type, flavour, and firmware, serial and board
ids from AUTOPILOT_VERSION). An autopilot that does not answer
AUTOPILOT_VERSION is asked again on a few later passes, not forever.
"""

from __future__ import annotations

import time
from typing import Any

import structlog

from mavjet.contract.subjects import shadow_key
from mavjet.drivers.mavlink.session import Session
from mavjet.gateway.config import GatewayConfig
from mavjet.gateway.services import TelemetryView
from mavjet.gateway.shadow.diff import iso
from mavjet.gateway.shadow.kvstore import ShadowStore

log = structlog.get_logger("mavjet.shadow")

VERSION_ASKS = 3  # passes that ask for AUTOPILOT_VERSION before giving up until the next reconnect or revision


def config_doc(vid: str, cfg: GatewayConfig, session: Session, now_s: float) -> dict[str, Any]:
    return {
        "vid": vid, "env": cfg.env, "gateway": cfg.instance, "endpoint": session.endpoint,
        "sysid": session.target_system, "compid": session.target_component, "state_rates_hz": dict(cfg.rates_hz),
        "streams_hz": dict(cfg.link.streams_hz), "heartbeat_timeout_s": cfg.link.heartbeat_timeout_s,
        "updated": iso(now_s),
    }


def meta_doc(vid: str, session: Session, telemetry: TelemetryView, version: dict[str, Any] | None,
             now_s: float) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "vid": vid, "sysid": session.target_system, "type": telemetry.vehicle_class, "flavour": telemetry.flavour,
        "updated": iso(now_s),
    }
    if version is not None:
        meta.update(version)
    else:
        meta["firmware"] = None
        meta["note"] = "no AUTOPILOT_VERSION answer"
    return meta


class IdentityWriter:
    """Writes `config` and `meta` for one vehicle when `due`."""

    def __init__(self, store: ShadowStore, vid: str, cfg: GatewayConfig, *, request_timeout_s: float) -> None:
        self.store = store
        self.vid = vid
        self.cfg = cfg
        self.request_timeout_s = request_timeout_s
        self.config_key = shadow_key(cfg.env, vid, "config")
        self.meta_key = shadow_key(cfg.env, vid, "meta")
        self.due = True
        self._asks = 0  # passes that got no AUTOPILOT_VERSION since the last `reset_asks()`

    def reset_asks(self) -> None:
        self._asks = 0

    async def write(self, session: Session, telemetry: TelemetryView) -> None:
        version = await session.autopilot_version(wait_s=self.request_timeout_s)
        now = time.time()
        try:
            await self.store.put(self.config_key, config_doc(self.vid, self.cfg, session, now))
            await self.store.put(self.meta_key, meta_doc(self.vid, session, telemetry, version, now))
        except Exception as exc:  # NATS away or the bucket missing: written again on the next pass
            log.warning("shadow_identity_write_failed", vehicle=self.vid, error=f"{type(exc).__name__}: {exc}")
            return
        if version is not None:
            self.due = False
            return
        self._asks += 1
        self.due = self._asks < VERSION_ASKS
