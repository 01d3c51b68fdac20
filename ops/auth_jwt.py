"""NATS decentralized auth artefacts: nkeys, operator/account/user JWTs, creds files.

This is the subset of what `nsc` writes that `mavjet auth` needs. The JWT
encoding is written here rather than taken from the `nats-jwt` package: that
package pins `pytz<2025`, pulls in pycryptodome, dacite and dataclasses-json
for what is a JSON header, JSON claims and one ed25519 signature, and has no
type information. The keys and signatures come from `nkeys` (the NATS
project's own package, on PyNaCl), which is also what nats-py needs for
`user_credentials`.

A JWT is `b64url(header) . b64url(claims) . b64url(ed25519(header.claims))`,
signed with the issuer's nkey; `jti` is the base32 SHA-512/256 of the claims
(the way the Go library computes it), `iss` the issuer's public key, `sub`
the subject's. Nothing here prints or logs a seed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys  # type: ignore[import-untyped]

OPERATOR = nkeys.PREFIX_BYTE_OPERATOR
ACCOUNT = nkeys.PREFIX_BYTE_ACCOUNT
USER = nkeys.PREFIX_BYTE_USER

_HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}


@dataclass(frozen=True, slots=True)
class NKey:
    """One nkey: its seed (secret, `S...`) and public key (`O...`, `A...`, `U...`)."""

    seed: bytes
    public: str

    @classmethod
    def create(cls, prefix: int) -> NKey:
        return cls.from_seed(nkeys.encode_seed(secrets.token_bytes(32), prefix))

    @classmethod
    def from_seed(cls, seed: bytes) -> NKey:
        kp = nkeys.from_seed(bytearray(seed.strip()))
        return cls(seed=bytes(seed.strip()), public=kp.public_key.decode())

    def sign(self, data: bytes) -> bytes:
        sig: bytes = nkeys.from_seed(bytearray(self.seed)).sign(data)
        return sig

    def __repr__(self) -> str:  # never show the seed
        return f"NKey({self.public})"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def encode_jwt(issuer: NKey, subject: str, name: str, nats: dict[str, Any], *, iat: int | None = None) -> str:
    claims: dict[str, Any] = {
        "jti": "",
        "iat": int(time.time()) if iat is None else iat,
        "iss": issuer.public,
        "name": name,
        "sub": subject,
        "nats": nats,
    }
    digest = hashlib.new("sha512_256", json.dumps(claims, separators=(",", ":")).encode()).digest()
    claims["jti"] = base64.b32encode(digest).rstrip(b"=").decode()
    signing_input = f"{_b64(json.dumps(_HEADER).encode())}.{_b64(json.dumps(claims, separators=(',', ':')).encode())}"
    return f"{signing_input}.{_b64(issuer.sign(signing_input.encode()))}"


def decode_claims(token: str) -> dict[str, Any]:
    """The claims of a JWT, not verified (the server verifies; this only reads)."""
    parts = token.split(".")
    if len(parts) != 3:
        raise ValueError("not a JWT")
    claims: dict[str, Any] = json.loads(_unb64(parts[1]))
    return claims


def operator_jwt(operator: NKey, name: str, *, system_account: str) -> str:
    return encode_jwt(operator, operator.public, name,
                      {"type": "operator", "version": 2, "system_account": system_account})


def account_jwt(operator: NKey, account: str, name: str, *, signing_keys: list[str], jetstream: bool,
                revocations: dict[str, int] | None = None) -> str:
    """An account JWT; `revocations` maps a user's public key to a time: its JWTs issued until then are refused."""
    limits: dict[str, Any] = {
        "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
        "wildcards": True, "conn": -1, "leaf": -1,
    }
    if jetstream:
        # Non-zero storage limits are what enables JetStream for an account; -1 is unlimited.
        limits |= {"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1,
                   "max_ack_pending": -1, "mem_max_stream_bytes": 0, "disk_max_stream_bytes": 0,
                   "max_bytes_required": False}
    else:
        limits |= {"mem_storage": 0, "disk_storage": 0, "streams": 0, "consumer": 0}
    nats: dict[str, Any] = {
        "type": "account", "version": 2, "limits": limits, "signing_keys": signing_keys,
        "default_permissions": {"pub": {}, "sub": {}},
    }
    if revocations:
        nats["revocations"] = dict(sorted(revocations.items()))
    return encode_jwt(operator, account, name, nats)


def user_jwt(signer: NKey, user: str, name: str, *, account: str, pub_allow: list[str],
             sub_allow: list[str], pub_deny: list[str] | None = None) -> str:
    pub: dict[str, Any] = {"allow": pub_allow}
    if pub_deny:
        pub["deny"] = pub_deny
    nats: dict[str, Any] = {
        "type": "user", "version": 2, "pub": pub, "sub": {"allow": sub_allow},
        "subs": -1, "data": -1, "payload": -1,
    }
    if signer.public != account:
        nats["issuer_account"] = account
    return encode_jwt(signer, user, name, nats)


def creds_text(token: str, seed: bytes) -> str:
    """A standard NATS credentials file (what `nsc generate creds` writes)."""
    return (
        "-----BEGIN NATS USER JWT-----\n"
        f"{token}\n"
        "------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n"
        "NKEYs are sensitive and should be treated as secrets.\n\n"
        "-----BEGIN USER NKEY SEED-----\n"
        f"{seed.decode()}\n"
        "------END USER NKEY SEED------\n\n"
        "*************************************************************\n"
    )


def creds_jwt(text: str) -> str:
    """The user JWT of a credentials file (the seed is not read)."""
    lines = text.splitlines()
    try:
        start = lines.index("-----BEGIN NATS USER JWT-----")
    except ValueError:
        raise ValueError("not a NATS credentials file") from None
    if start + 1 >= len(lines) or lines[start + 1].count(".") != 2:
        raise ValueError("not a NATS credentials file")
    return lines[start + 1].strip()


def write_secret(path: Path, text: str) -> None:
    """Write a file readable by its owner only (created 0600, never briefly wider)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)
