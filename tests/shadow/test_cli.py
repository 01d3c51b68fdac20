"""`mavjet shadow`: pure helpers, and the commands against a real nats-server."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from nats.aio.client import Client

from mavjet.contract.subjects import SHADOW_BUCKET, shadow_key
from mavjet.ops import shadow as cli
from mavjet.ops.natsserver import NatsServer

VID = "VID-009"


def test_apply_assignments() -> None:
    doc = {"mode": "LOITER", "params": {"RTL_ALT": 1500}}
    out = cli.apply_assignments(doc, ["params.RTL_ALT=2000", "params.LAND_SPEED=70", "armed=false", "mode="])
    assert out == {"params": {"RTL_ALT": 2000, "LAND_SPEED": 70}, "armed": False}
    assert doc["params"] == {"RTL_ALT": 1500}  # the input is not modified
    assert cli.apply_assignments({}, ["mode=GUIDED"]) == {"mode": "GUIDED"}
    with pytest.raises(cli.UsageError):
        cli.apply_assignments({}, ["mode"])


def test_diff_lines() -> None:
    assert cli.diff_lines(3, {"desired_revision": 3, "delta": {}, "link": "up"}) == []
    lines = cli.diff_lines(4, {"desired_revision": 3, "link": "lost", "delta": {
        "params.X": {"desired": 1, "reported": 0, "reason": "unknown parameter", "attempts": 2, "since": "t"}}})
    assert "has not applied desired revision 4" in lines[0]
    assert "params.X" in lines[1] and "unknown parameter" in lines[1]
    assert lines[-1] == "link: lost"
    assert "no reported" in cli.diff_lines(1, None)[0]


async def shadow(url: str, *argv: str) -> int:
    args = [*argv[:1], VID, *argv[1:], "--nats", url, "--env", "test"]
    return int(await anyio.to_thread.run_sync(cli.main, args))


async def test_set_get_history_diff_edit(provisioned: Client, nats_server: NatsServer,
                                         capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    url = nats_server.url
    assert await shadow(url, "set", "params.RTL_ALT=1500", "mode=GUIDED", "--force") == 0
    assert await shadow(url, "set", "params.LAND_SPEED=60") == 0
    capsys.readouterr()
    assert await shadow(url, "get", "--desired") == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert doc == {"mode": "GUIDED", "params": {"RTL_ALT": 1500, "LAND_SPEED": 60}}
    # invalid documents are refused unless forced
    assert await shadow(url, "set", "rates.position=0") == 2
    assert "rates.position" in capsys.readouterr().err
    # history keeps the revisions
    assert await shadow(url, "history") == 0
    assert capsys.readouterr().out.count("revision ") == 2
    # diff: no gateway has reported
    assert await shadow(url, "diff") == 1
    assert "no reported document" in capsys.readouterr().out
    kv = await provisioned.jetstream().key_value(SHADOW_BUCKET)
    desired_rev = (await kv.get(shadow_key("test", VID, "desired"))).revision
    await kv.put(shadow_key("test", VID, "reported"), json.dumps(
        {"desired_revision": desired_rev, "converged": True, "delta": {}, "link": "up"}).encode())
    assert await shadow(url, "diff") == 0
    assert "converged" in capsys.readouterr().out
    # edit: $EDITOR changes the file; written with the revision it was read at
    monkeypatch.setenv("EDITOR", "sed -i s/1500/1700/")
    monkeypatch.delenv("VISUAL", raising=False)
    assert await shadow(url, "edit") == 0
    assert "desired revision" in capsys.readouterr().out
    e = await kv.get(shadow_key("test", VID, "desired"))
    assert json.loads(e.value or b"{}")["params"]["RTL_ALT"] == 1700


async def test_watch_prints_updates(provisioned: Client, nats_server: NatsServer,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    kv = await provisioned.jetstream().key_value(SHADOW_BUCKET)
    await kv.put(shadow_key("test", VID, "desired"), b'{"mode": "GUIDED"}')
    await kv.put(shadow_key("test", VID, "reported"), json.dumps(
        {"desired_revision": 1, "converged": False, "link": "up",
         "delta": {"mode": {"reason": "failsafe active"}}}).encode())
    assert await shadow(nats_server.url, "watch", "--count", "2", "--timeout", "5") == 0
    out = capsys.readouterr().out
    assert "desired r" in out and "GUIDED" in out
    assert "converged=False" in out and "failsafe active" in out
