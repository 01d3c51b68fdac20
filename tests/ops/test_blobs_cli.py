"""`mavjet blobs put/get/ls` against a real nats-server (the module's main, in a thread)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from pathlib import Path

import pytest
from nats.aio.client import Client

from mavjet.ops import blobs as cli
from mavjet.ops.natsserver import NatsServer

DATA = os.urandom(300 * 1024 + 7)  # three 128 KiB chunks
HEX = hashlib.sha256(DATA).hexdigest()


async def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = await asyncio.to_thread(cli.main, list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


async def test_put_get_ls(provisioned: Client, nats_server: NatsServer, tmp_path: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "00000003.BIN"
    src.write_bytes(DATA)
    nats = ("--nats", nats_server.url)
    rc, out, err = await run(capsys, "put", str(src), "--name", "logs/VID-001/3.bin", *nats)
    assert rc == 0, err
    assert out.strip() == f"stored sha256/{HEX} as logs/VID-001/3.bin ({len(DATA)} bytes, sent 3/3 chunks)"
    assert "(100%)" in err.splitlines()[-1]  # progress lines on stderr

    rc, out, _ = await run(capsys, "put", str(src), "--name", "logs/VID-001/copy.bin", "--json", *nats)
    doc = json.loads(out)
    assert rc == 0 and doc["already_present"] and doc["sent_chunks"] == 0 and doc["sha256"] == HEX

    dest = tmp_path / "got.bin"
    rc, out, err = await run(capsys, "get", "logs/VID-001/3.bin", "-o", str(dest), *nats)
    assert rc == 0, err
    assert dest.read_bytes() == DATA and f"sha256 {HEX[:16]} verified" in out

    rc, out, _ = await run(capsys, "ls", "--json", *nats)
    rows = {r["object"]: r for r in json.loads(out)}
    assert rows["logs/VID-001/3.bin"]["link"] == f"sha256/{HEX}"
    assert rows[f"sha256/{HEX}"]["bytes"] == len(DATA) and rows[f"sha256/{HEX}"]["sha256"] == HEX
    rc, out, _ = await run(capsys, "ls", "logs/", *nats)
    assert rc == 0 and len(out.splitlines()) == 2 and f"-> sha256/{HEX}" in out


async def test_get_missing_is_one_line_exit_2(provisioned: Client, nats_server: NatsServer, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = await run(capsys, "get", "logs/nope.bin", "-o", str(tmp_path / "x"), "--nats", nats_server.url)
    assert rc == 2 and err.strip() == "mavjet blobs: TWIN_BLOBS 'logs/nope.bin': not_found"


def test_bad_name_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"x")
    assert cli.main(["put", str(f), "--name", "sha256/abc", "--nats", "nats://127.0.0.1:1"]) == 2
    assert "not a valid name" in capsys.readouterr().err
