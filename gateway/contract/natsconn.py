"""Connection options shared by the daemon and every operator subcommand.

`--nats URL[,URL...]`, `--creds FILE`, `--tls-ca/--tls-cert/--tls-key`.
Defaults come from MAVJET_NATS, read here in the CLI layer only.
"""

from __future__ import annotations

import argparse
import os
import ssl
from dataclasses import dataclass
from typing import Any

import anyio
import nats
from nats.aio.client import Client

from gateway.contract.errors import ConfigError, MavjetError

DEFAULT_NATS = "nats://127.0.0.1:4222"


class NatsUnavailable(MavjetError):
    """The NATS servers could not be reached."""

    def __init__(self, servers: tuple[str, ...], reason: str) -> None:
        super().__init__(f"cannot reach NATS at {', '.join(servers)}: {reason}")
        self.servers = servers
        self.reason = reason


@dataclass(frozen=True, slots=True, kw_only=True)
class NatsOptions:
    servers: tuple[str, ...] = (DEFAULT_NATS,)
    creds_file: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    connect_timeout_s: float = 2.0
    name: str = "mavjet"

    def __post_init__(self) -> None:
        if not self.servers:
            raise ConfigError("nats.servers", "at least one server URL is required")
        for s in self.servers:
            if "://" not in s:
                raise ConfigError("nats.servers", f"{s!r} is not a URL like nats://host:4222")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("nats.tls", "tls_cert and tls_key go together")

    def tls_context(self) -> ssl.SSLContext | None:
        if not (self.tls_ca or self.tls_cert):
            return None
        ctx = ssl.create_default_context(cafile=self.tls_ca)
        if self.tls_cert and self.tls_key:
            ctx.load_cert_chain(self.tls_cert, self.tls_key)
        return ctx


def add_nats_arguments(p: argparse.ArgumentParser, *, env_defaults: bool = True) -> None:
    """The connection flags. `env_defaults=False` leaves `--nats`/`--env` None when not given.

    A command with a config file (the daemon) resolves flag > environment >
    file > default itself (`gateway.config.resolve_config`), so it must be able
    to tell "not given" from "given the default".
    """
    g = p.add_argument_group("NATS connection")
    g.add_argument(
        "--nats",
        default=os.environ.get("MAVJET_NATS", DEFAULT_NATS) if env_defaults else None,
        help=f"server URL, or a comma-separated list for a cluster (default: $MAVJET_NATS or {DEFAULT_NATS})",
    )
    g.add_argument("--env", default=os.environ.get("MAVJET_ENV", "prod") if env_defaults else None,
                   help="fleet environment (default: $MAVJET_ENV or prod)")
    g.add_argument("--creds", help="NATS credentials file (JWT + nkey seed)")
    g.add_argument("--tls-ca", help="CA bundle to verify the servers")
    g.add_argument("--tls-cert", help="client certificate (with --tls-key)")
    g.add_argument("--tls-key", help="client key (with --tls-cert)")


def options_from_args(args: argparse.Namespace, *, name: str = "mavjet") -> NatsOptions:
    servers = tuple(s.strip() for s in str(args.nats).split(",") if s.strip())
    return NatsOptions(
        servers=servers,
        creds_file=args.creds,
        tls_ca=args.tls_ca,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        name=name,
    )


def connect_kwargs(opts: NatsOptions, **extra: Any) -> dict[str, Any]:
    """The arguments of `nats.connect` for `opts`: the one place they are spelled out.

    `extra` adds or overrides nats-py options (reconnect policy, callbacks, name).
    """
    kwargs: dict[str, Any] = {
        "servers": list(opts.servers),
        "name": opts.name,
        "connect_timeout": opts.connect_timeout_s,
    }
    if opts.creds_file:
        kwargs["user_credentials"] = opts.creds_file
    tls = opts.tls_context()
    if tls is not None:
        kwargs["tls"] = tls
    kwargs.update(extra)
    return kwargs


def connect_deadline_s(opts: NatsOptions) -> float:
    """How long one connect may take.

    nats-py keeps cycling through the server list even with reconnects off,
    so the deadline is ours: one connect timeout per server, plus slack.
    """
    return opts.connect_timeout_s * (len(opts.servers) + 1) + 1.0


async def connect(opts: NatsOptions, *, deadline_s: float | None = None, **extra: Any) -> Client:
    """One connect attempt, bounded by `deadline_s` (default `connect_deadline_s`); raises NatsUnavailable."""
    deadline = connect_deadline_s(opts) if deadline_s is None else deadline_s
    try:
        with anyio.fail_after(deadline):
            nc = await nats.connect(**connect_kwargs(opts, **extra))
    except TimeoutError as exc:
        raise NatsUnavailable(opts.servers, f"no server answered within {deadline:.0f}s") from exc
    except Exception as exc:  # nats-py raises a wide range here; translate at the boundary
        raise NatsUnavailable(opts.servers, f"{type(exc).__name__}: {exc}") from exc
    return nc


async def _quiet(_: Exception) -> None:
    return None


async def connect_once(opts: NatsOptions, **extra: Any) -> Client:
    """Connect for a short-lived operator command: fail fast with a clear error."""
    return await connect(opts, **{"allow_reconnect": False, "max_reconnect_attempts": 0, "error_cb": _quiet, **extra})
