"""The state digest: a few channels per vehicle, slowly, for a central cluster over leaf hubs.

An edge hub keeps its fleet's full-rate state (TWIN_STATE, ~24 samples a
vehicle-second); a central cluster over many hubs wants an overview, not
that rate over every hub's uplink (docs/deploy.md, "Central cluster over
leaf hubs"). NATS cannot decimate: a stream source copies every message. So
the gateway publishes the digest itself: every `1 / hz` seconds, the newest
sample of each chosen channel (`status` and `position` by default) on
`fleet.<env>.veh.<vid>.digest.<channel>`. The hub's TWIN_DIGEST keeps the
newest per subject (deploy/central/hub/jetstream/twin_digest.json), and the
centre's TWIN_STATE sources it with a subject transform back to
`.state.<channel>`, so `mavjet fleet` at the centre reads it like any
TWIN_STATE. After a cut the centre catches up with one sample per subject,
not the cut's backlog.

A `link` record always goes with it: readers take a vehicle as stale without
its gateway's liveness record (mavjet.ops.read.staleness). Its `period_s` is
the digest's period (the centre sees that rate, not the hub's), and it names
the `hub`: `[digest] hub`, or else the JetStream domain of the server the
gateway talks to (a leaf hub's domain is its name in the centre's sources).

Samples are core publishes, not acknowledged: latest-wins, and a lost one is
replaced one period later (`mavjet_publishes_total{kind="digest"}` counts them). Reading the twin costs no I/O; the service runs on
its own task, never on the state tick's path.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import structlog
from anyio.abc import TaskStatus

from mavjet.contract import envelope
from mavjet.contract.errors import ConfigError
from mavjet.contract.subjects import STATE_CHANNELS, check_token

if TYPE_CHECKING:
    from mavjet.gateway.services import ServiceContext

log = structlog.get_logger("mavjet.digest")

DIGEST_STREAM = "TWIN_DIGEST"
MAX_DIGEST_HZ = 1.0  # more than this is no digest: read the hub's TWIN_STATE
DOMAIN_RETRY_S = 30.0  # asking the server for its JetStream domain again after a failure


def digest_subject(env: str, vid: str, channel: str) -> str:
    """Where the digest of one channel of one vehicle goes (`vid="*"`, `channel=">"` for filters)."""
    return f"fleet.{env}.veh.{vid}.digest.{channel}"


@dataclass(frozen=True, slots=True, kw_only=True)
class DigestConfig:
    """`[digest]`: off unless `hz` > 0."""

    hz: float = 0.0
    channels: tuple[str, ...] = ("status", "position")
    hub: str = ""  # the hub's name in the digest's link record; empty: the server's JetStream domain

    def __post_init__(self) -> None:
        if not (self.hz == 0 or 0.001 <= self.hz <= MAX_DIGEST_HZ):
            raise ConfigError("digest.hz", f"must be 0 (off) or in [0.001, {MAX_DIGEST_HZ:g}] Hz, got {self.hz:g}")
        for ch in self.channels:
            if ch not in STATE_CHANNELS or ch == "link":
                raise ConfigError("digest.channels", f"{ch!r}: one of {', '.join(c for c in STATE_CHANNELS if c != 'link')}"
                                  " (the link record always goes with the digest)")
        if self.hub:
            check_token("digest.hub", self.hub)

    @classmethod
    def from_toml(cls, raw: Mapping[str, Any]) -> DigestConfig:
        """Build from the `[digest]` table, naming the offending key in errors."""
        kw: dict[str, Any] = {}
        for k, v in raw.items():
            if k == "hz":
                if isinstance(v, bool) or not isinstance(v, int | float):
                    raise ConfigError("digest.hz", f"expected a number, got {v!r}")
                kw[k] = float(v)
            elif k == "channels":
                if not isinstance(v, list | tuple) or not all(isinstance(c, str) for c in v):
                    raise ConfigError("digest.channels", f"expected a list of channel names, got {v!r}")
                kw[k] = tuple(v)
            elif k == "hub":
                if not isinstance(v, str):
                    raise ConfigError("digest.hub", f"expected a string, got {v!r}")
                kw[k] = v
            else:
                raise ConfigError(f"digest.{k}", "unknown key (allowed: channels, hub, hz)")
        return cls(**kw)


class DigestPublisher:
    """The digest as a `GatewayService` (the daemon adds it when `[digest] hz` > 0)."""

    def __init__(self, cfg: DigestConfig, *, env: str, instance: str) -> None:
        if cfg.hz <= 0:
            raise ValueError("the digest needs hz > 0")
        self.cfg = cfg
        self.env = env
        self.instance = instance
        self.period_s = 1.0 / cfg.hz
        self.hub: str | None = cfg.hub or None
        self.published = 0
        self.errors = 0
        self._domain_asked = -1e9

    async def _learn_hub(self, ctx: ServiceContext) -> None:
        """The hub's name, when not configured: the JetStream domain of the gateway's server.

        nats-py's AccountInfo drops the `domain` the server sends, so the API is asked directly.
        """
        nc = ctx.nats.nc
        now = time.monotonic()
        if self.hub is not None or nc is None or not nc.is_connected or now - self._domain_asked < DOMAIN_RETRY_S:
            return
        self._domain_asked = now
        try:
            info = json.loads((await nc.request("$JS.API.INFO", b"", timeout=2.0)).data)
        except Exception as exc:  # no JetStream yet, a slow server: the digest goes out without a hub name
            log.info("digest_hub_unknown", error=f"{type(exc).__name__}: {exc}")
            return
        domain = info.get("domain") if isinstance(info, dict) else None
        if isinstance(domain, str) and domain:
            self.hub = domain
            log.info("digest_hub", hub=domain)

    def records(self, ctx: ServiceContext, now_ns: int) -> list[tuple[str, bytes]]:
        """(subject, payload) for every vehicle this gateway records: its chosen channels and a link record."""
        out: list[tuple[str, bytes]] = []
        for vid, handle in ctx.vehicles.items():
            try:
                if not handle.may_record():  # a standby publishes nothing: the owner does
                    continue
                tv = handle.telemetry
                for ch in self.cfg.channels:
                    data = tv.channels.get(ch)
                    if data is not None:
                        t = tv.sample_ns.get(ch) or now_ns
                        out.append((digest_subject(self.env, vid, ch), envelope.pack(vid, t, dict(data))))
                link: dict[str, Any] = {"state": handle.session.health().state.value, "gateway": self.instance,
                                        "period_s": round(self.period_s, 3)}
                if self.hub is not None:
                    link["hub"] = self.hub
                out.append((digest_subject(self.env, vid, "link"), envelope.pack(vid, now_ns, link)))
            except Exception:  # one vehicle's odd telemetry must not stop the others' digest
                handle.report_error("digest")
        return out

    async def tick(self, ctx: ServiceContext) -> None:
        nc = ctx.nats.nc
        if nc is None or not nc.is_connected:
            return  # latest-wins: the next period publishes what is newest then
        await self._learn_hub(ctx)
        sent = 0
        try:
            for subject, payload in self.records(ctx, time.time_ns()):
                await nc.publish(subject, payload, headers={"Content-Type": envelope.CONTENT_TYPE})
                sent += 1
            await nc.flush(timeout=max(1, int(self.period_s)))
        except Exception as exc:
            self.errors += 1
            ctx.metrics.publishes.labels(kind="digest", result="error").inc()
            log.warning("digest_publish_failed", error=f"{type(exc).__name__}: {exc}")
        finally:
            self.published += sent
            ctx.metrics.publishes.labels(kind="digest", result="sent").inc(sent)

    async def run(self, ctx: ServiceContext, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        log.info("digest_started", hz=self.cfg.hz, channels=list(self.cfg.channels), hub=self.hub)
        task_status.started()
        next_t = time.monotonic()
        while True:
            await self.tick(ctx)
            # A fixed schedule: a slow tick does not lower the rate.
            next_t = max(next_t + self.period_s, time.monotonic())
            await anyio.sleep(max(0.0, next_t - time.monotonic()))
