"""`--json` on the read commands that lacked it, against a real nats-server: one document, parseable, with the facts."""

from __future__ import annotations

import json
import subprocess
import sys

from nats.aio.client import Client

from mavjet.contract.commands import CATALOGUE
from mavjet.contract.subjects import SHADOW_BUCKET, shadow_key
from mavjet.ops.natsserver import NatsServer

VID = "VID-007"


def mavjet(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mavjet.ops", *argv], capture_output=True, text=True,
                          timeout=60, check=False)


async def test_shadow_get_history_diff_json(provisioned: Client, nats_server: NatsServer) -> None:
    kv = await provisioned.jetstream().key_value(SHADOW_BUCKET)
    await kv.put(shadow_key("test", VID, "desired"), json.dumps({"mode": "GUIDED"}).encode())
    rev = await kv.put(shadow_key("test", VID, "desired"), json.dumps({"mode": "LOITER"}).encode())
    reported = {"desired_revision": rev - 1, "link": "up", "converged": False,
                "delta": {"mode": {"desired": "LOITER", "reported": "GUIDED", "reason": "mode change refused"}}}
    await kv.put(shadow_key("test", VID, "reported"), json.dumps(reported).encode())
    nats = ("--nats", nats_server.url, "--env", "test")

    out = mavjet("shadow", "get", VID, "--desired", "--json", *nats)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"desired": {"revision": rev, "value": {"mode": "LOITER"}}}
    # without --json a single document stays bare, as before
    assert json.loads(mavjet("shadow", "get", VID, "--desired", *nats).stdout) == {"mode": "LOITER"}

    out = mavjet("shadow", "history", VID, "--json", *nats)
    hist = json.loads(out.stdout)
    assert [h["value"] for h in hist] == [{"mode": "GUIDED"}, {"mode": "LOITER"}]
    assert [h["revision"] for h in hist] == [rev - 1, rev] and {h["operation"] for h in hist} == {"PUT"}

    out = mavjet("shadow", "diff", VID, "--json", *nats)
    assert out.returncode == 1, out.stderr  # not converged: same exit status as the text form
    doc = json.loads(out.stdout)
    assert doc["converged"] is False and doc["desired_revision"] == rev and doc["applied_revision"] == rev - 1
    assert doc["delta"]["mode"]["reason"] == "mode change refused" and len(doc["problems"]) == 2


async def test_monitor_once_json(provisioned: Client, nats_server: NatsServer) -> None:
    out = mavjet("monitor", "--once", "--json", "--nats", nats_server.url)
    assert out.returncode in (0, 1), out.stderr
    doc = json.loads(out.stdout)
    streams = {s["stream"]: s for s in doc["streams"]}
    assert {"TWIN_STATE", "TWIN_EVENTS", "TWIN_CMD"} <= set(streams)
    assert streams["TWIN_STATE"]["messages"] == 0 and streams["TWIN_STATE"]["replicas"] == 1
    assert isinstance(doc["problems"], list) and out.returncode == (1 if doc["problems"] else 0)
    bad = mavjet("monitor", "--json", "--nats", nats_server.url)
    assert bad.returncode == 2 and "--once" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_cmd_list_text_and_json() -> None:
    out = mavjet("cmd", "--list", "json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert [c["name"] for c in doc] == list(CATALOGUE)
    takeoff = next(c for c in doc if c["name"] == "takeoff")
    assert takeoff["params"][0]["name"] == "alt_m" and takeoff["params"][0]["unit"] == "m"
    text = mavjet("cmd", "--list")
    assert text.returncode == 0 and text.stdout.startswith("commands:") and "takeoff" in text.stdout


async def test_migrate_status_json_names_what_is_not_a_mirror(provisioned: Client, nats_server: NatsServer) -> None:
    # source and target the same server: every stream is there, and none is a mirror
    out = mavjet("migrate", "status", "--from", nats_server.url, "--to", nats_server.url, "--json")
    assert out.returncode == 1, out.stderr
    rows = {r["stream"]: r for r in json.loads(out.stdout)}
    assert "TWIN_STATE" in rows and "TWIN_CMD" not in rows
    assert rows["TWIN_STATE"]["error"] == "not a mirror" and rows["TWIN_STATE"]["in_sync"] is False


async def test_shadow_history_reads_what_kv_history_reads(provisioned: Client) -> None:
    """Revisions, operations and values as nats-py's watcher gives them (idle here, so it does not race)."""
    from mavjet.ops.shadow import _history

    js = provisioned.jetstream()
    kv = await js.key_value(SHADOW_BUCKET)
    key = shadow_key("test", "VID-008", "desired")
    assert await _history(js, key) == []
    for mode in ("GUIDED", "LOITER"):
        await kv.put(key, json.dumps({"mode": mode}).encode())
    await kv.delete(key)
    await kv.put(shadow_key("test", "VID-009", "desired"), b"{}")  # another key between: skipped
    await kv.put(key, b'{"mode": "RTL"}')
    ours, theirs = await _history(js, key), await kv.history(key)
    assert [(r.revision, r.operation, r.value) for r in ours] == \
        [(e.revision, e.operation, e.value or None) for e in theirs]
    assert [r.operation for r in ours] == [None, None, "DEL", None] and ours[-1].value == b'{"mode": "RTL"}'
