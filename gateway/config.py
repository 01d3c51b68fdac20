"""Gateway configuration: what can be set. Frozen, keyword-only dataclasses validated on construction.

Each key's default and validation live with its dataclass here; where a value
comes from (flag > environment > config file > default) is decided in one
place, `gateway/resolve.py`. Every error names the offending key.

One MAVLink protocol config (`GatewayConfig.protocols`, built from
`[commands]`) is used by every command the gateway sends to a vehicle, whether
a TWIN_CMD command or a shadow reconciliation step.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from mavjet.contract.errors import ConfigError
from mavjet.contract.natsconn import NatsOptions
from mavjet.contract.subjects import STATE_CHANNELS, check_token
from mavjet.drivers.mavlink.command import CommandConfig as MavCommandConfig
from mavjet.drivers.mavlink.link import LinkConfig
from mavjet.drivers.mavlink.runner import ProtocolConfig
from mavjet.drivers.mavlink.transport import Endpoint
from mavjet.gateway.publish.digest import DigestConfig
from mavjet.gateway.publish.uplink import UplinkConfig
from mavjet.gateway.shadow.config import ShadowConfig
from mavjet.gateway.twin.budget import EventBudgetConfig

DEFAULT_RATES_HZ: dict[str, float] = {
    "position": 10.0, "attitude": 10.0, "battery": 1.0, "gps": 1.0, "status": 1.0, "link": 1.0,
}

# The recorder samples the twin's position, which arrives at GLOBAL_POSITION_INT's rate (10 Hz by default).
MAX_TRACK_HZ = 10.0
# `--workers`: more processes than this only adds contention on an edge hub's few cores.
MAX_WORKERS = 32


@dataclass(frozen=True, slots=True, kw_only=True)
class VehicleConfig:
    vid: str
    endpoint: Endpoint
    # MAVLink system id. Required when vehicles share one udp: port (an edge
    # hub receiving a fleet on 14550): the gateway tells them apart by it.
    sysid: int | None = None
    # MAVLink 2 signing key (32 bytes, hex or raw); read by the vehicle twin. Set: sign and verify (docs/signing.md).
    signing_key_file: Path | None = None
    # Carry this vehicle's raw MAVLink over NATS (gateway/routes.py); None: the gateway's `tunnel` setting.
    tunnel: bool | None = None
    # A second way to the same vehicle (a companion's LTE beside the hub's radio): read both, send on the
    # live one, switch within 2 s of the primary going quiet (drivers/mavlink/duallink.py).
    backup: Endpoint | None = None

    def __post_init__(self) -> None:
        check_token("vehicles.vid", self.vid)
        if self.backup is not None and (self.sysid is not None and self.endpoint.scheme == "udp"):
            raise ConfigError("vehicles.backup", f"{self.vid}: a backup link is for a vehicle with its own endpoint, "
                                                 "not one on a shared udp port (sysid)")
        if self.backup is not None and str(self.backup) == str(self.endpoint):
            raise ConfigError("vehicles.backup", f"{self.vid}: the backup is the primary endpoint itself")
        if self.sysid is not None and not 1 <= self.sysid <= 255:
            raise ConfigError("vehicles.sysid", f"{self.sysid} is not a MAVLink system id (1..255)")


@dataclass(frozen=True, slots=True, kw_only=True)
class RouteConfig:
    """A ground station's endpoint (`--route`): the vehicle's frames go there untouched, and back (gateway/routes.py).

    `vid` picks the vehicle (needed when the gateway serves several);
    `sysids`/`compids` keep only the vehicle-side frames from those sources (empty: all).
    """

    endpoint: Endpoint
    vid: str | None = None
    sysids: frozenset[int] = frozenset()
    compids: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if self.endpoint.scheme not in ("udp", "udpout", "tcp"):
            raise ConfigError("routes.endpoint", f"{self.endpoint}: a route is udp:, udpout: or tcp:HOST:PORT")
        if self.vid is not None:
            check_token("routes.vid", self.vid)
        if any(not 0 <= i <= 255 for i in self.sysids | self.compids):
            raise ConfigError("routes.sysids", "MAVLink ids are 0..255")


def parse_route(spec: str) -> RouteConfig:
    """`ENDPOINT[?vid=VID&sysid=1,2&compid=1]` from the command line."""
    ep, _, query = spec.partition("?")
    kw: dict[str, Any] = {}
    for part in filter(None, query.split("&")):
        key, _, value = part.partition("=")
        if key == "vid":
            kw["vid"] = value
        elif key in ("sysid", "compid") and all(x.strip().isdigit() for x in value.split(",")):
            kw[f"{key}s"] = frozenset(int(x) for x in value.split(","))
        else:
            raise ConfigError("--route", f"{spec!r}: options are ?vid=VID&sysid=N[,N]&compid=N[,N]")
    return RouteConfig(endpoint=Endpoint.parse(ep.strip()), **kw)


class ConsumerMode(StrEnum):
    """How the gateway pulls its vehicles' commands from TWIN_CMD (docs/commands.md, Intake)."""

    AUTO = "auto"  # VEHICLE for a gateway of one vehicle, else GATEWAY
    VEHICLE = "vehicle"  # a durable consumer `gw_<vid>` per vehicle (MaxAckPending 1)
    GATEWAY = "gateway"  # one durable consumer per gateway process, filtered to the vehicles it owns


@dataclass(frozen=True, slots=True, kw_only=True)
class CommandsConfig:
    """The `[commands]` table: TWIN_CMD consumer settings and the MAVLink command protocol settings.

    The protocol settings (`ack_timeout_s`, `retries`, `in_progress_timeout_s`)
    reach the protocol machines only through `protocols`, for TWIN_CMD commands
    and shadow steps alike.
    """

    ack_wait_s: float = 30.0
    max_deliver: int = 20
    backoff_s: tuple[float, ...] = (1.0, 2.0, 5.0, 10.0)
    ack_timeout_s: float = 1.5  # MAVLink: wait this long for COMMAND_ACK before resending
    retries: int = 3  # MAVLink: resends after the first send (the protocol's max_attempts is retries + 1)
    in_progress_timeout_s: float = 30.0  # MAVLink: give up when IN_PROGRESS stops coming this long
    in_progress_interval_s: float = 5.0
    nak_delay_s: float = 2.0
    max_payload_bytes: int = 64 * 1024
    fetch_timeout_s: float = 5.0
    ledger_retention_s: float = 3600.0  # executed-id ledger; TWIN_CMD max_age (5m) bounds redelivery
    default_deadline_s: float = 30.0  # a command without a `deadline` expires this long after `issued`; 0: never
    # TWIN_CMD consumers (docs/commands.md, Intake): one per gateway, or one per vehicle as before;
    # `auto` is per vehicle for a gateway of one vehicle (a companion's credential names its consumer).
    consumer: ConsumerMode = ConsumerMode.AUTO
    max_ack_pending: int = 1000  # a gateway consumer's budget: commands in the gateway's hands at once
    max_queued_per_vehicle: int = 16  # waiting behind a vehicle's running command; more are rejected at once

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "consumer", ConsumerMode(self.consumer))
        except ValueError:
            raise ConfigError("commands.consumer", f"{self.consumer!r}: one of "
                              f"{', '.join(m.value for m in ConsumerMode)}") from None
        if self.max_ack_pending < 1 or self.max_queued_per_vehicle < 1:
            raise ConfigError("commands.max_ack_pending", "must be >= 1 (and max_queued_per_vehicle >= 1)")
        if self.ack_wait_s <= self.in_progress_interval_s:
            raise ConfigError("commands.ack_wait_s", "must exceed commands.in_progress_interval_s")
        if self.max_deliver < 1 or self.retries < 0:
            raise ConfigError("commands.max_deliver", "must be >= 1 (and retries >= 0)")
        if self.backoff_s and self.max_deliver <= len(self.backoff_s):
            raise ConfigError("commands.max_deliver", "must exceed the number of commands.backoff_s entries")
        if any(b <= 0 for b in self.backoff_s):
            raise ConfigError("commands.backoff_s", "every entry must be > 0 seconds")
        for key in ("ack_timeout_s", "in_progress_timeout_s", "in_progress_interval_s", "nak_delay_s",
                    "fetch_timeout_s", "ledger_retention_s"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"commands.{key}", "must be > 0")
        if self.ack_timeout_s > 60:
            raise ConfigError("commands.ack_timeout_s", "must be <= 60 s")
        if self.retries > 19:
            raise ConfigError("commands.retries", "must be <= 19 (20 transmissions)")
        if not 1024 <= self.max_payload_bytes <= 1024 * 1024:
            raise ConfigError("commands.max_payload_bytes", "must be in [1024, 1048576]")
        if self.default_deadline_s < 0:
            raise ConfigError("commands.default_deadline_s", "must be >= 0 (0 disables the default deadline)")
        if self.ledger_retention_s < 600:
            raise ConfigError("commands.ledger_retention_s", "must be >= 600 s (TWIN_CMD keeps commands 5 min)")

    @property
    def protocols(self) -> ProtocolConfig:
        """The MAVLink protocol config these settings give; the only place `retries` becomes `max_attempts`."""
        return ProtocolConfig(
            command=MavCommandConfig(
                ack_timeout_s=self.ack_timeout_s,
                max_attempts=self.retries + 1,
                in_progress_timeout_s=self.in_progress_timeout_s,
            )
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayConfig:
    vehicles: tuple[VehicleConfig, ...]
    nats: NatsOptions = field(default_factory=NatsOptions)
    env: str = "prod"
    instance: str = field(default_factory=socket.gethostname)
    rates_hz: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_RATES_HZ))
    link: LinkConfig = field(default_factory=LinkConfig)
    commands: CommandsConfig = field(default_factory=CommandsConfig)
    shadow: ShadowConfig = field(default_factory=ShadowConfig)
    event_budget: EventBudgetConfig = field(default_factory=EventBudgetConfig)
    uplink: UplinkConfig = field(default_factory=UplinkConfig)  # link-adaptive shaping (gateway/publish/uplink.py)
    state_dir: Path = Path(".mavjet/state")
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = None
    startup_timeout_s: float = 10.0
    shutdown_timeout_s: float = 5.0
    publish_timeout_s: float = 5.0
    nats_backoff_initial_s: float = 0.5
    nats_backoff_max_s: float = 10.0
    spool_max_events: int = 100_000
    max_inflight_state: int = 800  # acked state publishes awaiting their ack: 40,000 samples at state_ack_every 50
    publish_tick_s: float = 0.02
    state_ack_every: int = 50  # 1: every state publish waits for a JetStream ack (docs/decisions.md)
    uvloop: bool = False
    routes: tuple[RouteConfig, ...] = ()
    tunnel: bool = False  # raw MAVLink over core NATS for every vehicle (a vehicle's `tunnel` overrides)
    # A few channels, slowly, for a central cluster over leaf hubs (gateway/publish/digest.py); off by default.
    digest: DigestConfig = field(default_factory=DigestConfig)
    track_hz: float = 1.0  # the flight recorder: position samples per second while armed (gateway/stores/recorder.py); 0: off
    # One owner per vehicle (TWIN_LEASES, docs/ownership.md): only the gateway holding a vehicle's lease
    # acts for it; False only where one gateway is certain to be alone (it then never checks).
    ownership: bool = True
    workers: int = 1  # processes splitting the fleet (gateway/runtime/workers.py); 1: the single-process daemon

    def __post_init__(self) -> None:
        check_token("env", self.env)
        if not self.vehicles:
            raise ConfigError("vehicles", "at least one vehicle is required (--vehicle VID=ENDPOINT)")
        seen: set[str] = set()
        by_endpoint: dict[str, list[VehicleConfig]] = {}
        for v in self.vehicles:
            if v.vid in seen:
                raise ConfigError("vehicles.vid", f"{v.vid} is listed twice")
            seen.add(v.vid)
            by_endpoint.setdefault(str(v.endpoint), []).append(v)
        for ep, group in by_endpoint.items():
            if len(group) < 2:
                continue
            if group[0].endpoint.scheme != "udp":
                raise ConfigError("vehicles.endpoint", f"{ep} is used by {len(group)} vehicles; only a udp: "
                                  "listen port can be shared (told apart by sysid)")
            sysids = [v.sysid for v in group]
            if None in sysids or len(set(sysids)) != len(sysids):
                raise ConfigError("vehicles.sysid", f"vehicles sharing {ep} need distinct sysids, got {sysids}")
        for ch, hz in self.rates_hz.items():
            if ch not in STATE_CHANNELS:
                raise ConfigError(f"rates.{ch}", f"unknown state channel (known: {', '.join(STATE_CHANNELS)})")
            if not 0 < hz <= 50:
                raise ConfigError(f"rates.{ch}", "rate must be in (0, 50] Hz")
        if self.metrics_port is not None and not 0 <= self.metrics_port < 65536:
            raise ConfigError("metrics.port", "must be a TCP port")
        if self.state_ack_every < 1:
            raise ConfigError("state_ack_every", "must be >= 1 (1 acks every state message)")
        if not 0.001 <= self.publish_tick_s <= 0.5:
            raise ConfigError("publish_tick_s", "must be between 0.001 and 0.5 s")
        for key in ("startup_timeout_s", "shutdown_timeout_s", "publish_timeout_s"):
            if getattr(self, key) <= 0:
                raise ConfigError(key, "must be > 0")
        if not (self.track_hz == 0 or 0.01 <= self.track_hz <= MAX_TRACK_HZ):
            raise ConfigError("track_hz", f"must be 0 (off) or in [0.01, {MAX_TRACK_HZ:g}] Hz, got {self.track_hz:g}")
        if self.spool_max_events < 100:
            raise ConfigError("spool_max_events", "must be >= 100")
        if not 1 <= self.workers <= MAX_WORKERS:
            raise ConfigError("workers", f"must be in [1, {MAX_WORKERS}], got {self.workers}")
        for r in self.routes:
            if r.vid is None and len(self.vehicles) > 1:
                raise ConfigError("routes.vid", f"{r.endpoint}: name the vehicle (?vid=VID) when serving several")
            if r.vid is not None and r.vid not in seen:
                raise ConfigError("routes.vid", f"{r.vid} is not a vehicle of this gateway")

    def route_vid(self, route: RouteConfig) -> str:
        return route.vid if route.vid is not None else self.vehicles[0].vid

    def tunnel_for(self, v: VehicleConfig) -> bool:
        return self.tunnel if v.tunnel is None else v.tunnel

    @property
    def protocols(self) -> ProtocolConfig:
        """The one MAVLink protocol config: every command sender (commands, shadow) uses this."""
        return self.commands.protocols


def parse_backup(spec: str) -> tuple[str, Endpoint]:
    """`VID=ENDPOINT` of `--backup`: the vehicle's second link."""
    vid, sep, ep = spec.partition("=")
    if not sep:
        raise ConfigError("--backup", f"{spec!r}: expected VID=ENDPOINT, e.g. VID-001=tcp:10.0.0.5:5760")
    return check_token("--backup", vid.strip()), Endpoint.parse(ep.strip())


def parse_vehicle(spec: str) -> VehicleConfig:
    """`VID=ENDPOINT[?sysid=N]` from the command line."""
    vid, sep, rest = spec.partition("=")
    if not sep:
        raise ConfigError("--vehicle", f"{spec!r}: expected VID=ENDPOINT, e.g. VID-001=tcp:127.0.0.1:5760")
    ep, _, query = rest.partition("?")
    sysid = None
    if query:
        key, _, value = query.partition("=")
        if key != "sysid" or not value.isdigit():
            raise ConfigError("--vehicle", f"{spec!r}: the only option is ?sysid=N")
        sysid = int(value)
    return VehicleConfig(vid=vid.strip(), endpoint=Endpoint.parse(ep.strip()), sysid=sysid)
