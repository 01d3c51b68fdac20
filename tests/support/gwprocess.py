"""A real gateway process on a vehicle credential, for the tests under the generated auth (tests/security)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from nats.js import JetStreamContext

from mavjet.contract.subjects import STATE_STREAM, state_filter
from tests.support.wait import wait_for_async


@asynccontextmanager
async def gateway_process(*, vid: str, endpoint: str, url: str, env: str, creds: str, state_dir: Path,
                          instance: str, log: Path, more: dict[str, str] | None = None,
                          ) -> AsyncIterator[subprocess.Popen[bytes]]:
    """`mavjet gateway` serving `vid` at `endpoint` (and `more`'s vehicles) with `creds`, its JSON log in `log`."""
    vehicles = [arg for v, ep in {vid: endpoint, **(more or {})}.items() for arg in ("--vehicle", f"{v}={ep}")]
    with log.open("wb") as out:
        proc = subprocess.Popen(  # noqa: ASYNC220 - a child process for the whole test
            [sys.executable, "-m", "mavjet.ops", "gateway", *vehicles,
             "--nats", url, "--env", env, "--creds", creds,
             "--state-dir", str(state_dir), "--instance", instance, "--log-json"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=20)


async def state_published(js: JetStreamContext, env: str, vid: str, *, timeout_s: float = 40) -> None:
    """Wait (bounded) until TWIN_STATE holds a sample of `vid`: the gateway is up, connected and publishing."""

    async def published() -> bool:
        info = await js.stream_info(STATE_STREAM, subjects_filter=state_filter(env, vid))
        return bool(info.state.subjects)

    await wait_for_async(published, timeout_s=timeout_s)
