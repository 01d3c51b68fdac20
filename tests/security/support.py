"""Allowed / refused checks against a server enforcing the generated permissions."""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import nats.errors
import nats.js.errors
from nats.aio.client import Client

from mavjet.contract.errors import MavjetError
from mavjet.ops.auth_jwt import NKey, creds_jwt
from tests.support.wait import wait_for

# Refused JetStream requests get no answer: a short timeout keeps the suite quick.
JS_TIMEOUT_S = 1.0


def violations(nc: Client) -> list[str]:
    errors: list[Exception] = nc._mavjet_errors  # type: ignore[attr-defined]
    return [str(e).lower() for e in errors if "permissions violation" in str(e).lower()]


async def refused(nc: Client, subject: str, action: Callable[[], Awaitable[Any]]) -> None:
    """`action` fails or goes unanswered, and the server reports a permissions violation on `subject`."""
    before = len(violations(nc))
    try:
        await action()
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError, nats.js.errors.Error, TimeoutError, MavjetError):
        pass
    else:
        # A plain publish returns at once; the violation arrives asynchronously.
        pass
    await nc.flush()
    want = subject.lower()
    await wait_for(lambda: any(want in v for v in violations(nc)[before:]), timeout_s=5)


def clean(nc: Client) -> None:
    assert violations(nc) == [], violations(nc)


CLOSED = b"<closed by the server>"


async def connect_reply(host: str, port: int, creds: Path) -> bytes:
    """The server's answer to a CONNECT with `creds`, spoken raw (a refused nats-py connect leaks its socket).

    `PONG` when accepted, `-ERR 'Authorization Violation'` when refused.
    """
    text = await anyio.Path(creds).read_text()
    seed = next(line.strip() for line in text.splitlines() if line.strip().startswith("SU"))
    token = creds_jwt(text)
    async with await anyio.connect_tcp(host, port) as s:
        with anyio.fail_after(5):
            info = await s.receive()
            assert info.startswith(b"INFO ")
            nonce = json.loads(info[5:].split(b"\r\n", 1)[0])["nonce"]
            sig = base64.urlsafe_b64encode(NKey.from_seed(seed.encode()).sign(nonce.encode())).rstrip(b"=").decode()
            connect = {"verbose": False, "pedantic": False, "protocol": 1, "jwt": token, "sig": sig}
            await s.send(b"CONNECT " + json.dumps(connect).encode() + b"\r\nPING\r\n")
            reply = b""
            while b"PONG" not in reply and b"-ERR" not in reply:
                try:
                    reply += await s.receive()
                except anyio.EndOfStream:  # closed without a word (a server in the middle of a reload)
                    return reply + CLOSED
    return reply
