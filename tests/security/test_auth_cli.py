"""`mavjet auth init` / `add-vehicle`: files, modes, no secret printed, new vehicles without invalidating others."""

from __future__ import annotations

import stat
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from mavjet.contract import envelope
from mavjet.contract.subjects import event_subject, state_subject
from mavjet.ops import auth
from mavjet.ops.auth_jwt import decode_claims
from tests.security.conftest import ENV, Secured
from tests.security.support import JS_TIMEOUT_S, clean, refused


def _jwt(creds: Path) -> str:
    lines = creds.read_text().splitlines()
    return lines[lines.index("-----BEGIN NATS USER JWT-----") + 1]


def test_init_writes_conf_and_creds_owner_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "auth"
    assert auth.main(["init", str(d), "--env", "prod", "--vehicle", "VID-001", "--gateway", "hub-a=VID-010,VID-011"]) == 0
    out = capsys.readouterr().out
    names = {p.name for p in (d / "creds").iterdir()}
    assert names == {"VID-001.creds", "hub-a.creds", "operator.creds", "viewer.creds", "analytics.creds", "admin.creds"}
    seeds = []
    for p in [*(d / "creds").iterdir(), *(d / "keys").iterdir()]:
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
        seeds.append(p.read_text().split("-----BEGIN USER NKEY SEED-----\n")[-1].split("\n")[0].strip())
    assert all(s.startswith("S") and len(s) > 50 for s in seeds)
    conf = (d / "auth.conf").read_text()
    assert "resolver: MEMORY" in conf and "resolver_preload" in conf
    assert not any(seed in out or seed in conf for seed in seeds)  # no secret printed or in the server config
    claims = decode_claims(_jwt(d / "creds" / "hub-a.creds"))
    assert claims["name"] == "hub-a"
    allow = claims["nats"]["pub"]["allow"]
    assert "fleet.prod.veh.VID-010.state.>" in allow and "fleet.prod.veh.VID-011.evt.>" in allow
    assert not any("VID-001" in s for s in allow)
    assert claims["nats"]["sub"]["allow"][0] == "_INBOX_hub-a.>"
    # A second init does not silently replace every credential.
    assert auth.main(["init", str(d), "--vehicle", "VID-002"]) == 2
    assert "already" in capsys.readouterr().err


def test_bad_names_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert auth.main(["init", str(tmp_path / "a"), "--vehicle", "VID.001"]) == 2
    assert "VID.001" in capsys.readouterr().err
    assert auth.main(["add-vehicle", str(tmp_path / "nothing"), "VID-001"]) == 2


async def test_add_vehicle_keeps_the_others_valid(hub: Secured) -> None:
    before = (hub.dir / "creds" / "VID-001.creds").read_text()
    conf = (hub.dir / "auth.conf").read_text()
    path = auth.add_vehicle(hub.dir, "VID-005")
    assert path.name == "VID-005.creds"
    assert (hub.dir / "creds" / "VID-001.creds").read_text() == before
    assert (hub.dir / "auth.conf").read_text() == conf  # no server reload needed
    # The running server accepts the new credential and the old one.
    v5, v1 = await hub.connect("VID-005"), await hub.connect("VID-001")
    try:
        for nc, vid in ((v5, "VID-005"), (v1, "VID-001")):
            await nc.jetstream(timeout=JS_TIMEOUT_S).publish(state_subject(ENV, vid, "link"), envelope.pack(vid, 10**9, {}))
            clean(nc)
        forged = event_subject(ENV, "VID-001", "armed")
        await refused(v5, forged, lambda: v5.publish(forged, b""))
    finally:
        await v5.close()
        await v1.close()
    # A hub gateway's vehicle list changes: a new credential of the same name.
    assert auth.main(["add-gateway", str(hub.dir), "hub=VID-003,VID-006"]) == 0
    gw = await hub.connect("hub")
    try:
        await gw.jetstream(timeout=JS_TIMEOUT_S).publish(state_subject(ENV, "VID-006", "link"), envelope.pack("VID-006", 10**9, {}))
        clean(gw)
        gone = state_subject(ENV, "VID-004", "link")
        await refused(gw, gone, lambda: gw.publish(gone, b""))
    finally:
        await gw.close()


async def test_operator_tools_work_with_role_credentials(hub: Secured, capsys: pytest.CaptureFixture[str]) -> None:
    """`mavjet twin/events/shadow` with viewer.creds, `shadow set` with operator.creds; viewer cannot set."""
    from mavjet.ops import events, shadow, twin

    admin = await hub.connect("admin")
    try:
        await admin.jetstream().publish(state_subject(ENV, "VID-001", "battery"), envelope.pack("VID-001", 10**9, {"pct": 90}))
        await admin.jetstream().publish(event_subject(ENV, "VID-001", "armed"), envelope.pack("VID-001", 10**9, {}))
    finally:
        await admin.close()
    conn = ["--nats", hub.server.url, "--env", ENV]
    viewer, operator = ["--creds", hub.creds("viewer")], ["--creds", hub.creds("operator")]
    assert await _in_thread(twin.main, ["VID-001", *conn, *viewer]) == 0
    assert "VID-001" in capsys.readouterr().out
    assert await _in_thread(events.main, ["--vid", "VID-001", *conn, *viewer]) == 0
    assert "armed" in capsys.readouterr().out
    assert await _in_thread(shadow.main, ["set", "VID-001", "mode=GUIDED", *conn, *operator]) == 0
    assert await _in_thread(shadow.main, ["get", "VID-001", *conn, *viewer]) == 0
    assert "GUIDED" in capsys.readouterr().out
    assert "Violation" not in hub.log()
    assert await _in_thread(shadow.main, ["set", "VID-001", "mode=LAND", *conn, *viewer]) != 0
    assert "Publish Violation" in hub.log()


async def _in_thread(fn: Callable[[list[str]], int], argv: list[str]) -> int:
    """The CLIs run their own event loop: call them off this test's loop."""
    return await anyio.to_thread.run_sync(fn, argv)
