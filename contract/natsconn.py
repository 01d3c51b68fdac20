"""Connection options shared by the daemon and every operator subcommand.

`--nats URL[,URL...]`, `--creds FILE`, `--tls-ca/--tls-cert/--tls-key`.
Defaults come from MAVJET_NATS, read here in the CLI layer only.
"""

from __future__ import annotations

import argparse
import base64
import errno
import json
import os
import re
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import nats.errors
from nats.aio.client import Client

from mavjet.contract import natsadapter
from mavjet.contract.errors import ConfigError, MavjetError
from mavjet.contract.redact import redact

DEFAULT_NATS = "nats://127.0.0.1:4222"


class NatsUnavailable(MavjetError):
    """The NATS servers could not be reached."""

    def __init__(self, servers: tuple[str, ...], reason: str) -> None:
        # Redacted here, at the boundary: the message ends up in logs and on stderr.
        super().__init__(redact(f"cannot reach NATS at {', '.join(servers)}: {reason}"))
        self.servers = servers
        self.reason = redact(reason)


class NatsRefused(NatsUnavailable):
    """NatsUnavailable because every server refused the TCP connection (`connect(refused_is_final=True)`)."""


class _AllRefused(Exception):
    """Raised from the error callback to end nats-py's connect: nothing listens at any server."""


# The URL schemes nats-py connects with.
URL_SCHEMES = ("nats", "tls", "ws", "wss")


def with_scheme(server: str) -> str:
    """`127.0.0.1:4222` -> `nats://127.0.0.1:4222`, as the nats CLI takes it; a URL with a scheme is left as it is."""
    return server if "://" in server else f"nats://{server}"


def check_url(url: str) -> None:
    """Raise ConfigError unless `url` is a server URL nats-py can dial (scheme, host, numeric port)."""
    shown = redact(url)
    if "://" not in url:
        raise ConfigError("nats.servers", f"{shown!r} is not a URL like nats://host:4222")
    parts = urlsplit(url)
    if parts.scheme not in URL_SCHEMES:
        raise ConfigError("nats.servers", f"{shown!r}: scheme must be one of {', '.join(URL_SCHEMES)}")
    try:
        port = parts.port
    except ValueError:
        raise ConfigError("nats.servers", f"{shown!r}: the port is not a number in 0..65535") from None
    if not parts.hostname or port == 0 or parts.path not in ("", "/"):
        raise ConfigError("nats.servers", f"{shown!r} is not a URL like nats://host:4222")


# OpenSSL's verify codes (X509_V_ERR_*) in the words an operator fixes them by.
_VERIFY_HINTS = {
    10: "expired: renew the server certificate",
    9: "not yet valid: check the clocks",
    18: "self-signed server certificate: pass it (or its CA) with --tls-ca",
    19: "self-signed CA in the chain that --tls-ca does not hold",
    20: "unknown CA: the server certificate is not signed by a CA in --tls-ca",
    21: "unknown CA: the server sent no chain to a CA in --tls-ca",
    62: "hostname mismatch: the URL's host is not in the certificate",
    64: "hostname mismatch: the URL's IP address is not in the certificate",
}


def describe_error(exc: BaseException) -> str:
    """One line for a connect failure; a TLS failure says which certificate check failed."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        hint = _VERIFY_HINTS.get(exc.verify_code)
        suffix = f" ({hint})" if hint else ""
        return f"TLS certificate verify failed: {exc.verify_message or exc.reason}{suffix}"
    if isinstance(exc, ssl.SSLError):
        return f"TLS handshake failed: {exc.reason or exc}"
    return redact(f"{type(exc).__name__}: {exc}")


@dataclass(frozen=True, slots=True, kw_only=True)
class NatsOptions:
    servers: tuple[str, ...] = (DEFAULT_NATS,)
    creds_file: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    connect_timeout_s: float = 2.0
    name: str = "mavjet"
    # The JetStream domain the gateway's API calls go to. None: the connected server's. A gateway on a
    # companion's leaf node names the hub's: its commands, shadow, leases and blobs are the hub's, while
    # its events, published on their subjects, are taken by the leaf's own stream (docs/companion.md).
    domain: str | None = None

    def __post_init__(self) -> None:
        if not self.servers:
            raise ConfigError("nats.servers", "at least one server URL is required")
        if self.domain is not None and not re.fullmatch(r"[A-Za-z0-9_-]+", self.domain):
            raise ConfigError("nats.domain", f"{self.domain!r} is not a JetStream domain (letters, digits, - and _)")
        for s in self.servers:
            check_url(s)
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("nats.tls", "tls_cert and tls_key go together")

    def check_files(self) -> None:
        """Raise ConfigError naming the key if a creds or TLS file is missing, unreadable or not PEM.

        Called before anything starts (a missing file is not worth retrying);
        construction does no I/O so that a config can be built and inspected anywhere.
        """
        for key, path in (("creds", self.creds_file), ("tls_ca", self.tls_ca),
                          ("tls_cert", self.tls_cert), ("tls_key", self.tls_key)):
            if path is None:
                continue
            try:
                with Path(path).open("rb") as f:
                    f.read(1)
            except OSError as exc:
                raise ConfigError(f"nats.{key}", f"{path}: {exc.strerror or exc}") from None
        try:
            self.tls_context()
        except (ssl.SSLError, ValueError) as exc:
            raise ConfigError("nats.tls", f"cannot load the TLS files: {exc}") from None

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
    file > default itself (`mavjet.gateway.resolve.resolve_config`), so it must be able
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


def inbox_prefix_for_name(name: str) -> str:
    """The reply-inbox prefix of a `mavjet auth` identity (its permissions allow `<prefix>.>` only)."""
    return f"_INBOX_{name}"


def creds_inbox_prefix(creds_file: str) -> str | None:
    """The inbox prefix for the identity in a creds file: `_INBOX_<name>` from its JWT's `name`.

    Read without verifying (the server verifies). None when the file is not
    readable or not a mavjet identity, so nats-py's default `_INBOX` stays.
    """
    try:
        lines = Path(creds_file).read_text().splitlines()
        token = lines[lines.index("-----BEGIN NATS USER JWT-----") + 1].strip()
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        name = str(claims.get("name", ""))
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    if not name or not all(c.isalnum() or c in "-_" for c in name):
        return None
    return inbox_prefix_for_name(name)


async def open_client(servers: str | list[str] = DEFAULT_NATS, **kwargs: Any) -> Client:
    """`nats.connect(servers, **kwargs)`: every mavjet connection is made here.

    The client is `natsadapter.new_client()`'s: flush()'s PING behind the
    commands nats-py still buffers (`OrderedFlushClient`).
    """
    nc = natsadapter.new_client()
    await nc.connect(servers, **kwargs)
    return nc


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
        prefix = creds_inbox_prefix(opts.creds_file)
        if prefix is not None:
            kwargs["inbox_prefix"] = prefix
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


async def connect(opts: NatsOptions, *, deadline_s: float | None = None, refused_is_final: bool = False,
                  **extra: Any) -> Client:
    """One connect attempt, bounded by `deadline_s` (default `connect_deadline_s`); raises NatsUnavailable.

    `refused_is_final`: end at once (NatsRefused) when every server refused the TCP connection.
    nats-py retries a refused connect every 2 s until the deadline; for a command a person is
    waiting on, a refusal from every server in the list is the answer already.
    """
    deadline = connect_deadline_s(opts) if deadline_s is None else deadline_s
    opts.check_files()
    # nats-py retries a failed TLS handshake until our deadline and then all we see is the
    # timeout: remember the last error it reported so the message says what actually failed.
    last: list[Exception] = []
    user_cb: Callable[[Exception], Awaitable[None]] | None = extra.pop("error_cb", None)
    refusals = 0
    connecting = True  # later refusals (a reconnecting client's) are nats-py's to retry

    async def error_cb(exc: Exception) -> None:
        nonlocal refusals
        last[:] = [exc]
        refused = isinstance(exc, ConnectionRefusedError) or getattr(exc, "errno", None) == errno.ECONNREFUSED
        if refused_is_final and connecting and refused:
            refusals += 1  # nats-py tries each server once before trying any again
            if refusals >= len(opts.servers):
                raise _AllRefused
        if user_cb is not None:
            await user_cb(exc)

    try:
        with anyio.fail_after(deadline):
            nc = await open_client(**connect_kwargs(opts, error_cb=error_cb, **extra))
    except TimeoutError as exc:
        why = f"; last error: {describe_error(last[0])}" if last else ""
        raise NatsUnavailable(opts.servers, f"no server answered within {deadline:.0f}s{why}") from exc
    except _AllRefused:
        raise NatsRefused(opts.servers, "connection refused: is a nats-server listening there? "
                                        "(--nats URL or $MAVJET_NATS)") from None
    except Exception as exc:  # nats-py raises a wide range here; translate at the boundary
        if isinstance(exc.__cause__, _AllRefused) or isinstance(exc.__context__, _AllRefused):
            raise NatsRefused(opts.servers, "connection refused: is a nats-server listening there? "
                                            "(--nats URL or $MAVJET_NATS)") from None
        raise NatsUnavailable(opts.servers, describe_error(exc)) from exc
    connecting = False
    return nc


def server_name(nc: Client) -> str:
    """`host:port` of the server `nc` is connected to, for logs: a URL's userinfo may be a token."""
    url = nc.connected_url
    return f"{url.hostname}:{url.port}" if url is not None and url.hostname else "?"


async def close(nc: Client) -> str | None:
    """Close `nc`, also when its server went first; returns why the close could not finish cleanly, or None.

    nats-py's `close()` flushes the socket, and raises if the server reset it meanwhile (a Ctrl-C reaches
    `mavjet demo`'s nats-server and its clients together): the connection is gone either way.
    """
    if nc.is_closed:
        return None
    try:
        await nc.close()
    except (OSError, nats.errors.Error) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


async def _quiet(_: Exception) -> None:
    return None


async def connect_once(opts: NatsOptions, **extra: Any) -> Client:
    """Connect for a short-lived operator command: fail fast with a clear error."""
    return await connect(opts, **{"allow_reconnect": False, "max_reconnect_attempts": 0, "error_cb": _quiet, **extra})
