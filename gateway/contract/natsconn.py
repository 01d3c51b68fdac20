"""Connection options shared by the daemon and every operator subcommand.

`--nats URL[,URL...]`, `--creds FILE`, `--tls-ca/--tls-cert/--tls-key`.
Defaults come from MAVJET_NATS, read here in the CLI layer only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import ssl
from dataclasses import dataclass
from typing import Any

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


def add_nats_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("NATS connection")
    g.add_argument(
        "--nats",
        default=os.environ.get("MAVJET_NATS", DEFAULT_NATS),
        help="server URL, or a comma-separated list for a cluster (default: $MAVJET_NATS or %(default)s)",
    )
    g.add_argument("--env", default=os.environ.get("MAVJET_ENV", "prod"), help="fleet environment (default: %(default)s)")
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


async def connect_once(opts: NatsOptions, **extra: Any) -> Client:
    """Connect for a short-lived operator command: fail fast with a clear error."""
    kwargs: dict[str, Any] = {
        "servers": list(opts.servers),
        "name": opts.name,
        "connect_timeout": opts.connect_timeout_s,
        "allow_reconnect": False,
        "max_reconnect_attempts": 0,
    }
    if opts.creds_file:
        kwargs["user_credentials"] = opts.creds_file
    tls = opts.tls_context()
    if tls is not None:
        kwargs["tls"] = tls
    kwargs.update(extra)

    async def _quiet(_: Exception) -> None:
        return None

    kwargs.setdefault("error_cb", _quiet)
    # nats-py keeps cycling through the server list even with reconnects off,
    # so the deadline is ours: one connect timeout per server, plus slack.
    deadline_s = opts.connect_timeout_s * (len(opts.servers) + 1) + 1.0
    try:
        async with asyncio.timeout(deadline_s):
            return await nats.connect(**kwargs)
    except TimeoutError as exc:
        raise NatsUnavailable(opts.servers, f"no server answered within {deadline_s:.0f}s") from exc
    except Exception as exc:  # nats-py raises a wide range here; translate at the boundary
        raise NatsUnavailable(opts.servers, f"{type(exc).__name__}: {exc}") from exc
