"""`mavjet auth revoke DIR NAME` on a real nats-server: after a configuration reload the revoked
credential cannot connect and its open connection is closed; every other credential still works."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from mavjet.contract.errors import ConfigError
from mavjet.contract.subjects import event_subject
from mavjet.ops import auth
from mavjet.ops.auth_jwt import creds_jwt, decode_claims
from tests.security.conftest import ENV, Secured
from tests.security.support import CLOSED, clean, connect_reply
from tests.support.wait import wait_for, wait_for_async

pytestmark = pytest.mark.timeout(90)


# How nats-server refuses a revoked user: at CONNECT once the reload has applied, or, for a
# connection that authenticated in the moment the reload applied, by closing it right after.
_REFUSALS = (b"Authorization Violation", b"User Authentication Revoked")


async def _refused(s: Secured, creds: Path) -> bool:
    reply = await connect_reply(s.server.host, s.server.port, creds)
    if reply.endswith(CLOSED):  # closed mid-reload without saying why: ask again
        return False
    refused = any(r in reply for r in _REFUSALS)
    assert b"PONG" in reply or refused, reply
    return refused


async def test_revoked_credential_is_refused_after_reload(hub: Secured, tmp_path: Path) -> None:
    stolen = tmp_path / "stolen-VID-001.creds"
    shutil.copy(hub.creds("VID-001"), stolen)  # what a thief kept
    user = decode_claims(creds_jwt(stolen.read_text()))["sub"]
    v1, v2, op = await hub.connect("VID-001"), await hub.connect("VID-002"), await hub.connect("operator")
    try:
        out = await anyio.to_thread.run_sync(lambda: subprocess.run(
            [sys.executable, "-m", "mavjet.ops", "auth", "revoke", str(hub.dir), "VID-001"],
            capture_output=True, text=True, timeout=60, check=False))
        assert out.returncode == 0, out.stderr
        assert "reload" in out.stderr and not await anyio.Path(hub.creds("VID-001")).exists()
        manifest = json.loads((hub.dir / "auth.json").read_text())
        assert user in manifest["revocations"] and manifest["revoked"] == {"VID-001": [user]}
        # Before the reload nothing has changed for the server.
        assert not await _refused(hub, stolen)

        assert hub.server.proc is not None
        hub.server.proc.send_signal(signal.SIGHUP)  # nats-server --signal reload
        await wait_for_async(lambda: _refused(hub, stolen), timeout_s=20)
        # Its open connection is closed; the others keep theirs and new ones are accepted.
        await wait_for(lambda: v1.is_closed, timeout_s=10)
        await v2.jetstream().publish(event_subject(ENV, "VID-002", "armed"), b"{}")
        assert not await _refused(hub, Path(hub.creds("VID-002")))
        assert not await _refused(hub, Path(hub.creds("hub")))
        clean(v2)
        clean(op)
        assert "Reloaded" in hub.log() or "reloaded" in hub.log().lower()

        # A new credential for the vehicle (a new key) works; the old one stays refused.
        auth.add_vehicle(hub.dir, "VID-001")
        assert not await _refused(hub, Path(hub.creds("VID-001")))
        assert await _refused(hub, stolen)
    finally:
        for nc in (v1, v2, op):
            await nc.close()


def test_revoke_refuses_unknown_names_and_admin(secured: Secured) -> None:
    with pytest.raises(ConfigError, match="no credential"):
        auth.revoke(secured.dir, "VID-999")
    with pytest.raises(ConfigError, match="admin"):
        auth.revoke(secured.dir, "admin")
    before = (secured.dir / "auth.conf").read_text()
    auth.revoke(secured.dir, "viewer", at_s=1)
    auth.revoke(secured.dir, "analytics", at_s=2)
    after = (secured.dir / "auth.conf").read_text()
    assert after != before and after.count("\n") == before.count("\n")  # one line replaced, nothing else
    assert len(json.loads((secured.dir / "auth.json").read_text())["revocations"]) == 2  # they accumulate
