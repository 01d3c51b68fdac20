"""Where each setting comes from: one resolution, one precedence per key.

command-line flag > environment (MAVJET_NATS, MAVJET_ENV, MAVJET_TRACK_HZ,
MAVJET_WORKERS) > config file (TOML) > default (the dataclasses of
`gateway/config.py`). The CLI's argparse defaults are None, so "not given" is
never confused with "given the default". Unknown keys and wrong types are
refused naming the key (`ConfigError`).
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from mavjet.contract.errors import ConfigError
from mavjet.contract.natsconn import DEFAULT_NATS, NatsOptions, check_url, with_scheme
from mavjet.drivers.mavlink.link import DEFAULT_STREAMS_HZ, LinkConfig
from mavjet.drivers.mavlink.transport import Endpoint
from mavjet.gateway.config import (
    DEFAULT_RATES_HZ,
    CommandsConfig,
    GatewayConfig,
    RouteConfig,
    VehicleConfig,
    parse_backup,
    parse_route,
    parse_vehicle,
)
from mavjet.gateway.publish.digest import DigestConfig
from mavjet.gateway.publish.uplink import UplinkConfig
from mavjet.gateway.shadow.config import ShadowConfig
from mavjet.gateway.twin.budget import EventBudgetConfig

# -- building from TOML + CLI ---------------------------------------------

_TOP_KEYS = {
    "shadow", "event_budget", "uplink", "env", "instance", "state_dir", "vehicles", "nats", "rates", "link", "commands", "metrics",
    "startup_timeout_s", "shutdown_timeout_s", "publish_timeout_s", "spool_max_events",
    "max_inflight_state", "uvloop", "publish_tick_s", "routes", "tunnel",
    "state_ack_every", "nats_backoff_initial_s", "nats_backoff_max_s", "track_hz", "workers", "ownership",
    "digest",
}
_NATS_KEYS = {"servers", "creds", "tls_ca", "tls_cert", "tls_key", "connect_timeout_s", "domain"}


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
    if "ownership" in raw:
        kw["ownership"] = _typed("ownership", raw["ownership"], bool)
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
        _check_keys(key, v, {"vid", "endpoint", "sysid", "signing_key_file", "tunnel", "backup"})
        if "vid" not in v or "endpoint" not in v:
            raise ConfigError(key, "needs both vid and endpoint")
        try:
            vehicles.append(VehicleConfig(vid=_typed(f"{key}.vid", v["vid"], str),
                                          endpoint=Endpoint.parse(_typed(f"{key}.endpoint", v["endpoint"], str)),
                                          sysid=_typed(f"{key}.sysid", v["sysid"], int) if "sysid" in v else None,
                                          signing_key_file=Path(_typed(f"{key}.signing_key_file", v["signing_key_file"], str))
                                          if "signing_key_file" in v else None,
                                          tunnel=_typed(f"{key}.tunnel", v["tunnel"], bool) if "tunnel" in v else None,
                                          backup=Endpoint.parse(_typed(f"{key}.backup", v["backup"], str))
                                          if "backup" in v else None))
        except ConfigError as exc:
            raise ConfigError(f"{key}.{exc.key.split('.')[-1]}", exc.reason) from exc

    nats_raw = _typed("nats", raw.get("nats", {}), dict)
    _check_keys("nats", nats_raw, _NATS_KEYS)
    servers = nats_raw.get("servers", [DEFAULT_NATS])
    if isinstance(servers, str):
        servers = [s.strip() for s in servers.split(",")]
    nats_kw: dict[str, Any] = {"servers": tuple(_typed("nats.servers", servers, (list, tuple)))}
    for k in ("creds", "tls_ca", "tls_cert", "tls_key", "domain"):
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
    cli_backups = overrides.pop("backups", None)
    if cli_backups:  # `--backup VID=ENDPOINT`: the second link of a vehicle given here or in the file
        by_vid = {v.vid: v for v in vehicles}
        for vid, ep in cli_backups:
            if vid not in by_vid:
                raise ConfigError("--backup", f"{vid} is not a vehicle of this gateway (--vehicle or the config file)")
            by_vid[vid] = dataclasses.replace(by_vid[vid], backup=ep)
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
    digest = DigestConfig.from_toml(_typed("digest", raw.get("digest", {}), dict))
    return GatewayConfig(
        vehicles=tuple(vehicles), nats=NatsOptions(**nats_kw), rates_hz=rates, link=link, commands=commands,
        shadow=shadow, event_budget=event_budget, uplink=uplink, digest=digest, **kw,
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


def _servers(text: str, *, source: str) -> tuple[str, ...]:
    """`--nats` / $MAVJET_NATS: URLs or `host:port` as the nats CLI takes them; an error names `source`."""
    servers = tuple(with_scheme(s.strip()) for s in text.split(",") if s.strip())
    if not servers:
        raise ConfigError(source, "empty; give a server URL like nats://127.0.0.1:4222")
    for url in servers:
        try:
            check_url(url)
        except ConfigError as exc:
            raise ConfigError(source, f"{exc.reason} (nats://HOST:PORT or HOST:PORT)") from None
    return servers


def resolve_config(raw: Mapping[str, Any], *, flags: Mapping[str, Any], environ: Mapping[str, str]) -> GatewayConfig:
    """flag > environment > file > default, per key.

    `flags` holds the command line's values with None for "not given" (the
    daemon's argparse defaults are None): `nats`, `env`, `creds`, `tls_ca`,
    `tls_cert`, `tls_key`, `vehicle` (a list of VID=ENDPOINT), `metrics_port`,
    `metrics_host`, `state_dir`, `instance`, `uvloop`, `track_hz`, `workers`, `jetstream_domain`. Other keys
    are ignored.
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
        backups=[parse_backup(b) for b in flags.get("backup") or ()],
        routes=[parse_route(r) for r in flags.get("route") or ()],
        nats={
            "servers": _servers(servers, source="--nats" if nats_flag is not None else ENV_NATS)
            if servers is not None else None,
            "creds_file": flags.get("creds"), "tls_ca": flags.get("tls_ca"),
            "tls_cert": flags.get("tls_cert"), "tls_key": flags.get("tls_key"),
            "domain": flags.get("jetstream_domain"),
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
