"""Gateway configuration: frozen, keyword-only dataclasses validated on construction.

Every source is resolved here, in one place (`resolve_config`), with one
precedence per key: command-line flag > environment (MAVJET_NATS, MAVJET_ENV,
MAVJET_TRACK_HZ, MAVJET_WORKERS) > config file > default. The CLI's argparse defaults are None, so "not given"
is never confused with "given the default". Every error names the offending key.

One MAVLink protocol config (`GatewayConfig.protocols`, built from
`[commands]`) is used by every command the gateway sends to a vehicle, whether
a TWIN_CMD command or a shadow reconciliation step.

Length: about 500 lines, over the project's ~400, on purpose: every key, its
default, its validation and the one resolution (flag > env > file > default)
sit in one module, so nothing about configuration is decided elsewhere.
"""

from __future__ import annotations

import dataclasses
import socket
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from mavjet.contract.errors import ConfigError
from mavjet.contract.natsconn import DEFAULT_NATS, NatsOptions
from mavjet.contract.subjects import STATE_CHANNELS, check_token
from mavjet.drivers.mavlink.command import CommandConfig as MavCommandConfig
from mavjet.drivers.mavlink.link import DEFAULT_STREAMS_HZ, LinkConfig
from mavjet.drivers.mavlink.runner import ProtocolConfig
from mavjet.drivers.mavlink.transport import Endpoint
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

    def __post_init__(self) -> None:
        check_token("vehicles.vid", self.vid)
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

    def __post_init__(self) -> None:
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
    track_hz: float = 1.0  # the flight recorder: position samples per second while armed (gateway/stores/recorder.py); 0: off
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


# -- building from TOML + CLI ---------------------------------------------

_TOP_KEYS = {
    "shadow", "event_budget", "uplink", "env", "instance", "state_dir", "vehicles", "nats", "rates", "link", "commands", "metrics",
    "startup_timeout_s", "shutdown_timeout_s", "publish_timeout_s", "spool_max_events",
    "max_inflight_state", "uvloop", "publish_tick_s", "routes", "tunnel",
    "state_ack_every", "nats_backoff_initial_s", "nats_backoff_max_s", "track_hz", "workers",
}
_NATS_KEYS = {"servers", "creds", "tls_ca", "tls_cert", "tls_key", "connect_timeout_s"}


def _check_keys(section: str, raw: Mapping[str, Any], allowed: set[str]) -> None:
    for k in raw:
        if k not in allowed:
            where = f"{section}.{k}" if section else k
            raise ConfigError(where, f"unknown key (allowed: {', '.join(sorted(allowed))})")


def _typed(key: str, value: Any, kind: type | tuple[type, ...]) -> Any:
    if isinstance(value, bool) and kind in (int, float, (int, float)):
        raise ConfigError(key, f"expected a number, got {value!r}")
    if not isinstance(value, kind):
        want = "a number" if kind == (int, float) else getattr(kind, "__name__", kind)
        raise ConfigError(key, f"expected {want}, got {type(value).__name__} {value!r}")
    return value


_D = TypeVar("_D")


def _section(section: str, cls: type[_D], raw: Mapping[str, Any]) -> _D:
    """Build a config table's dataclass, checking each value against its field's default type."""
    _check_keys(section, raw, {f.name for f in dataclasses.fields(cls)})  # type: ignore[arg-type]
    kw: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in raw:
            continue
        key, value = f"{section}.{f.name}", raw[f.name]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if isinstance(default, bool):
            kw[f.name] = _typed(key, value, bool)
        elif isinstance(default, int):
            kw[f.name] = _typed(key, value, int)
        elif isinstance(default, float):
            kw[f.name] = float(_typed(key, value, (int, float)))
        elif isinstance(default, tuple):
            kw[f.name] = tuple(float(_typed(key, v, (int, float))) for v in _typed(key, value, (list, tuple)))
        elif isinstance(default, dict):
            kw[f.name] = dict(_typed(key, value, dict))
        else:
            kw[f.name] = value
    try:
        return cls(**kw)
    except TypeError as exc:  # a value the checks above let through; still name the table
        raise ConfigError(section, str(exc)) from exc


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


def build_config(raw: Mapping[str, Any], **overrides: Any) -> GatewayConfig:
    """Merge a parsed TOML document with CLI overrides (None means 'not given')."""
    _check_keys("", raw, _TOP_KEYS)
    kw: dict[str, Any] = {}
    for key in ("env", "instance"):
        if key in raw:
            kw[key] = _typed(key, raw[key], str)
    for key in ("startup_timeout_s", "shutdown_timeout_s", "publish_timeout_s",
                "nats_backoff_initial_s", "nats_backoff_max_s", "publish_tick_s", "track_hz"):
        if key in raw:
            kw[key] = float(_typed(key, raw[key], (int, float)))
    for key in ("spool_max_events", "max_inflight_state", "state_ack_every", "workers"):
        if key in raw:
            kw[key] = _typed(key, raw[key], int)
    if "uvloop" in raw:
        kw["uvloop"] = _typed("uvloop", raw["uvloop"], bool)
    if "tunnel" in raw:
        kw["tunnel"] = _typed("tunnel", raw["tunnel"], bool)
    routes: list[RouteConfig] = []
    for i, r in enumerate(_typed("routes", raw.get("routes", []), list)):
        key = f"routes[{i}]"
        if isinstance(r, str):
            routes.append(parse_route(r))
            continue
        _typed(key, r, dict)
        _check_keys(key, r, {"endpoint", "vid", "sysids", "compids"})
        if "endpoint" not in r:
            raise ConfigError(key, "needs an endpoint")
        routes.append(RouteConfig(
            endpoint=Endpoint.parse(_typed(f"{key}.endpoint", r["endpoint"], str)),
            vid=_typed(f"{key}.vid", r["vid"], str) if "vid" in r else None,
            sysids=frozenset(_typed(f"{key}.sysids", x, int) for x in _typed(f"{key}.sysids", r.get("sysids", []), list)),
            compids=frozenset(_typed(f"{key}.compids", x, int) for x in _typed(f"{key}.compids", r.get("compids", []), list)),
        ))
    if routes:
        kw["routes"] = tuple(routes)
    if "state_dir" in raw:
        kw["state_dir"] = Path(_typed("state_dir", raw["state_dir"], str))

    vehicles: list[VehicleConfig] = []
    for i, v in enumerate(_typed("vehicles", raw.get("vehicles", []), list)):
        key = f"vehicles[{i}]"
        _typed(key, v, dict)
        _check_keys(key, v, {"vid", "endpoint", "sysid", "signing_key_file", "tunnel"})
        if "vid" not in v or "endpoint" not in v:
            raise ConfigError(key, "needs both vid and endpoint")
        try:
            vehicles.append(VehicleConfig(vid=_typed(f"{key}.vid", v["vid"], str),
                                          endpoint=Endpoint.parse(_typed(f"{key}.endpoint", v["endpoint"], str)),
                                          sysid=_typed(f"{key}.sysid", v["sysid"], int) if "sysid" in v else None,
                                          signing_key_file=Path(_typed(f"{key}.signing_key_file", v["signing_key_file"], str))
                                          if "signing_key_file" in v else None,
                                          tunnel=_typed(f"{key}.tunnel", v["tunnel"], bool) if "tunnel" in v else None))
        except ConfigError as exc:
            raise ConfigError(f"{key}.{exc.key.split('.')[-1]}", exc.reason) from exc

    nats_raw = _typed("nats", raw.get("nats", {}), dict)
    _check_keys("nats", nats_raw, _NATS_KEYS)
    servers = nats_raw.get("servers", [DEFAULT_NATS])
    if isinstance(servers, str):
        servers = [s.strip() for s in servers.split(",")]
    nats_kw: dict[str, Any] = {"servers": tuple(_typed("nats.servers", servers, (list, tuple)))}
    for k in ("creds", "tls_ca", "tls_cert", "tls_key"):
        if k in nats_raw:
            nats_kw["creds_file" if k == "creds" else k] = _typed(f"nats.{k}", nats_raw[k], str)
    if "connect_timeout_s" in nats_raw:
        nats_kw["connect_timeout_s"] = float(_typed("nats.connect_timeout_s", nats_raw["connect_timeout_s"], (int, float)))

    rates = dict(DEFAULT_RATES_HZ)
    rates.update(
        {ch: float(_typed(f"rates.{ch}", hz, (int, float))) for ch, hz in _typed("rates", raw.get("rates", {}), dict).items()}
    )

    link_raw = dict(_typed("link", raw.get("link", {}), dict))
    if "streams_hz" in link_raw:
        streams = dict(DEFAULT_STREAMS_HZ)
        streams.update(
            {name: float(_typed(f"link.streams_hz.{name}", hz, (int, float)))
             for name, hz in _typed("link.streams_hz", link_raw["streams_hz"], dict).items()}
        )
        link_raw["streams_hz"] = streams
    link = _section("link", LinkConfig, link_raw)
    commands = _section("commands", CommandsConfig, _typed("commands", raw.get("commands", {}), dict))

    metrics_raw = _typed("metrics", raw.get("metrics", {}), dict)
    _check_keys("metrics", metrics_raw, {"host", "port"})
    if "port" in metrics_raw:
        kw["metrics_port"] = _typed("metrics.port", metrics_raw["port"], int)
    if "host" in metrics_raw:
        kw["metrics_host"] = _typed("metrics.host", metrics_raw["host"], str)

    # CLI overrides win over the file.
    cli_vehicles = overrides.pop("vehicles", None)
    if cli_vehicles:
        given: set[str] = set()
        for v in cli_vehicles:  # one flag per vid: a second one is a typo, not an override
            if v.vid in given:
                raise ConfigError("--vehicle", f"{v.vid} is given twice")
            given.add(v.vid)
        by_vid = {v.vid: v for v in vehicles}
        for v in cli_vehicles:
            by_vid[v.vid] = v
        vehicles = list(by_vid.values())
    cli_routes = overrides.pop("routes", None)
    if cli_routes:  # the command line's routes are added to the file's
        kw["routes"] = tuple(kw.get("routes", ())) + tuple(cli_routes)
    cli_nats = overrides.pop("nats", None)
    if cli_nats is not None:
        nats_kw.update({k: v for k, v in cli_nats.items() if v is not None})
    kw.update({k: v for k, v in overrides.items() if v is not None})
    shadow = ShadowConfig.from_toml(_typed("shadow", raw.get("shadow", {}), dict))
    event_budget = _section("event_budget", EventBudgetConfig, _typed("event_budget", raw.get("event_budget", {}), dict))
    uplink = _section("uplink", UplinkConfig, _typed("uplink", raw.get("uplink", {}), dict))
    return GatewayConfig(
        vehicles=tuple(vehicles), nats=NatsOptions(**nats_kw), rates_hz=rates, link=link, commands=commands,
        shadow=shadow, event_budget=event_budget, uplink=uplink, **kw,
    )


# -- the one place every source meets ---------------------------------------

ENV_NATS = "MAVJET_NATS"
ENV_ENV = "MAVJET_ENV"
ENV_TRACK_HZ = "MAVJET_TRACK_HZ"
ENV_WORKERS = "MAVJET_WORKERS"


def load_toml(path: Path | None) -> dict[str, Any]:
    """The config file's mapping (empty without a file); errors name `--config`."""
    if path is None:
        return {}
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ConfigError("--config", f"{path} does not exist") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("--config", f"{path} is not valid TOML: {exc}") from exc


def _servers(text: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",") if s.strip())


def resolve_config(raw: Mapping[str, Any], *, flags: Mapping[str, Any], environ: Mapping[str, str]) -> GatewayConfig:
    """flag > environment > file > default, per key.

    `flags` holds the command line's values with None for "not given" (the
    daemon's argparse defaults are None): `nats`, `env`, `creds`, `tls_ca`,
    `tls_cert`, `tls_key`, `vehicle` (a list of VID=ENDPOINT), `metrics_port`,
    `metrics_host`, `state_dir`, `instance`, `uvloop`, `track_hz`, `workers`. Other keys are ignored.
    """
    nats_flag = flags.get("nats")
    servers = nats_flag if nats_flag is not None else environ.get(ENV_NATS)
    env = flags.get("env")
    if env is None:
        env = environ.get(ENV_ENV)
    track_hz = flags.get("track_hz")
    if track_hz is None and environ.get(ENV_TRACK_HZ):
        try:
            track_hz = float(environ[ENV_TRACK_HZ])
        except ValueError:
            raise ConfigError(ENV_TRACK_HZ, f"{environ[ENV_TRACK_HZ]!r} is not a number of Hz") from None
    workers = flags.get("workers")
    if workers is None and environ.get(ENV_WORKERS):
        if not environ[ENV_WORKERS].strip().isdigit():
            raise ConfigError(ENV_WORKERS, f"{environ[ENV_WORKERS]!r} is not a number of processes")
        workers = int(environ[ENV_WORKERS])
    return build_config(
        raw,
        vehicles=[parse_vehicle(v) for v in flags.get("vehicle") or ()],
        routes=[parse_route(r) for r in flags.get("route") or ()],
        nats={
            "servers": _servers(servers) if servers is not None else None,
            "creds_file": flags.get("creds"), "tls_ca": flags.get("tls_ca"),
            "tls_cert": flags.get("tls_cert"), "tls_key": flags.get("tls_key"),
        },
        env=env,
        metrics_port=flags.get("metrics_port"),
        metrics_host=flags.get("metrics_host"),
        state_dir=flags.get("state_dir"),
        instance=flags.get("instance"),
        uvloop=flags.get("uvloop"),
        track_hz=track_hz,
        workers=workers,
    )
