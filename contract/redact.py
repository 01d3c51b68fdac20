"""Secrets out of everything mavjet prints: the one redaction function.

A NATS URL may carry a password (`nats://user:pass@host`) or a token
(`nats://TOKEN@host`, `?token=...`); a credentials file holds a user JWT and an
nkey seed (`SU...`). None of these may reach a log line, an error message or
`--help`. Rather than trust every call site to leave them out, everything
printed passes through `redact()` at the boundary: the structlog processor
chain (`mavjet.gateway.runtime.logs`), the one-line CLI errors (`mavjet.ops.runner`, the
daemon's `main`) and the NATS error messages (`mavjet.contract.natsconn`).

Redaction keeps what an operator needs to debug (scheme, user name, host,
port) and replaces only the secret with `***`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, MutableMapping
from typing import Any

MASK = "***"

# scheme://userinfo@ : the password after the first ':' (or the whole userinfo: a token) is secret.
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/@\s?#'\"]+)@")
# user:password@host without a scheme (a parsed URL's netloc).
_NETLOC = re.compile(r"(?<![\w/:@.\-])(?P<user>[A-Za-z0-9._~%+\-]+):(?P<secret>[^@\s/:'\"]+)@(?=[A-Za-z0-9\[])")
# ?token=... / &password=... in a URL query (nats-py also accepts a bare token as userinfo).
_QUERY = re.compile(r"(?P<key>[?&](?:token|auth_token|password|pass|pwd|secret|jwt|nkey|seed)=)[^&\s#'\"]+",
                    re.IGNORECASE)
# An nkey seed: 'S' + the key type (User, Account, Operator, Node/server, Cluster) + base32.
_SEED = re.compile(r"\bS[UAONCX][A-Z2-7]{40,}\b")
# The armoured blocks of a .creds file, and a bare JWT.
_CREDS_BLOCK = re.compile(r"(-----BEGIN [A-Z ]+-----)[^-]+?(-*END [A-Z ]+-----)")
_JWT = re.compile(r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]+")


def _userinfo(m: re.Match[str]) -> str:
    user, sep, _secret = m["userinfo"].partition(":")
    return f"{m['scheme']}{user}:{MASK}@" if sep else f"{m['scheme']}{MASK}@"


def redact(text: str) -> str:
    """`text` with URL passwords and tokens, creds file contents, JWTs and nkey seeds replaced by `***`."""
    if not text:
        return text
    text = _USERINFO.sub(_userinfo, text)
    text = _NETLOC.sub(lambda m: f"{m['user']}:{MASK}@", text)
    text = _QUERY.sub(lambda m: m["key"] + MASK, text)
    text = _CREDS_BLOCK.sub(lambda m: f"{m[1]}{MASK}{m[2]}", text)
    text = _JWT.sub(MASK, text)
    return _SEED.sub(MASK, text)


def redact_value(value: Any) -> Any:
    """`redact` applied to every string inside `value` (lists, tuples, sets, mappings); other values as they are."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list | tuple | set | frozenset):
        return type(value)(redact_value(v) for v in value)
    if isinstance(value, Mapping):
        return {k: redact_value(v) for k, v in value.items()}
    if isinstance(value, BaseException):  # an exception object rendered later: render it redacted now
        return redact(f"{type(value).__name__}: {value}")
    return value


def redact_event(_logger: Any, _method: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """A structlog processor: every value of the event, redacted (after `format_exc_info`, before rendering)."""
    for key, value in event_dict.items():
        if key != "exc_info":  # a traceback tuple, if any is left, is formatted (and redacted) by the renderer's text
            event_dict[key] = redact_value(value)
    return event_dict
