"""`mavjet restore DIR`: put a `mavjet backup` back into a server.

Each stream is created from its saved config and refilled in the original
order with the original subjects, headers and payloads, so KV history and
objects come back byte-exact. What cannot come back, and why:
- stored timestamps: the server stamps messages as they arrive (the backup
  keeps the originals in its records); max_age counts from the restore.
- sequence numbers start at the original first sequence (config first_seq)
  but gaps inside a stream (deleted or superseded messages) are closed up, so
  KV revisions can be renumbered.
Three adjustments keep the replay faithful:
- `Nats-Expected-*` headers are stored with a message (e.g. by a KV update)
  but are preconditions for *that* publish; replaying them would be refused;
  they are dropped.
- the duplicate window is shrunk to the server minimum while filling, so two
  messages that legitimately share a Nats-Msg-Id (published further apart
  than the window) are both kept; the saved window is put back at the end.
- TWIN_CMD contents are skipped unless `--with-commands`: restored commands
  would be executed again by a running gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
from nats.aio.client import Client

from mavjet.contract import natsconn
from mavjet.contract.subjects import CMD_STREAM
from mavjet.ops.backup import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    BackupError,
    StreamEntry,
    api_request,
    config_path,
    file_sha256,
    messages_path,
)
from mavjet.ops.resolve import connect
from mavjet.ops.runner import duration, run_cli

# The server refuses duplicate windows under 100 ms.
MIN_DUPLICATE_WINDOW_NS = 100_000_000
MAX_INFLIGHT = 512


@dataclass(frozen=True, slots=True, kw_only=True)
class Restored:
    name: str
    messages: int
    skipped: str = ""


def read_manifest(directory: Path) -> list[StreamEntry]:
    path = directory / MANIFEST
    if not path.is_file():
        raise BackupError("", f"{directory} has no {MANIFEST}: not a complete mavjet backup")
    raw = json.loads(path.read_text())
    if raw.get("format") != FORMAT or int(raw.get("version", 0)) > FORMAT_VERSION:
        raise BackupError("", f"{path}: format {raw.get('format')!r} v{raw.get('version')} is not one this "
                              f"mavjet reads ({FORMAT} v{FORMAT_VERSION})")
    return [StreamEntry.from_dict(s) for s in raw["streams"]]


def replay_headers(headers: dict[str, str] | None) -> dict[str, str] | None:
    """Pure: the headers to publish a stored message with (drops publish preconditions)."""
    if not headers:
        return None
    kept = {k: v for k, v in headers.items() if not k.startswith("Nats-Expected-")}
    return kept or None


def fill_config(saved: dict[str, Any], entry: StreamEntry) -> dict[str, Any]:
    """Pure: the config to create the stream with while it is refilled."""
    cfg = dict(saved)
    cfg["sealed"] = False
    cfg["duplicate_window"] = MIN_DUPLICATE_WINDOW_NS
    cfg.pop("sources", None)
    if entry.first_seq > 1:
        cfg["first_seq"] = entry.first_seq
    return cfg


async def _stream_state(nc: Client, name: str, timeout_s: float) -> dict[str, Any] | None:
    try:
        info = await api_request(nc, f"STREAM.INFO.{name}", timeout_s=timeout_s)
    except BackupError as exc:
        if "not found" in exc.reason:
            return None
        raise
    state: dict[str, Any] = info.get("state", {})
    return state


async def restore_stream(nc: Client, directory: Path, entry: StreamEntry, *, replace: bool,
                         with_commands: bool, timeout_s: float) -> Restored:
    name = entry.name
    saved = json.loads(config_path(directory, name).read_text())
    msgs = messages_path(directory, name)
    if file_sha256(msgs) != entry.sha256:
        raise BackupError(name, f"{msgs.name} does not match the manifest's checksum (damaged backup)")
    state = await _stream_state(nc, name, timeout_s)
    if state is not None:
        if int(state.get("messages", 0)) > 0 and not replace:
            raise BackupError(name, f"exists with {state['messages']} messages; restore into an empty server, "
                                    "or pass --replace to delete it first")
        await api_request(nc, f"STREAM.DELETE.{name}", timeout_s=timeout_s)
    if saved.get("mirror"):
        # A mirror refills itself from its origin.
        await api_request(nc, f"STREAM.CREATE.{name}", saved, timeout_s=timeout_s)
        return Restored(name=name, messages=0, skipped="mirror: refills from its origin")
    skip = name == CMD_STREAM and not with_commands
    await api_request(nc, f"STREAM.CREATE.{name}", fill_config(saved, entry), timeout_s=timeout_s)
    count = 0 if skip else await _replay(nc, name, msgs, timeout_s=timeout_s)
    final = dict(saved)
    if entry.first_seq > 1:
        final["first_seq"] = entry.first_seq
    await api_request(nc, f"STREAM.UPDATE.{name}", final, timeout_s=timeout_s)
    if skip:
        return Restored(name=name, messages=0,
                        skipped=f"{entry.messages} queued commands not replayed (--with-commands to replay)")
    if count != entry.messages:
        raise BackupError(name, f"restored {count} messages, the backup has {entry.messages}")
    return Restored(name=name, messages=count)


async def _replay(nc: Client, name: str, path: Path, *, timeout_s: float) -> int:
    js = nc.jetstream(timeout=timeout_s)
    pending: list[asyncio.Future[Any]] = []
    last_used: dict[str, float] = {}  # Nats-Msg-Id -> monotonic time of its last publish
    window_s = MIN_DUPLICATE_WINDOW_NS / 1e9
    count = 0
    last_seq = 0

    async def drain() -> None:
        nonlocal last_seq
        for fut in pending:
            ack = await fut
            if ack.stream != name:
                raise BackupError(name, f"a message was stored in {ack.stream}: overlapping stream subjects")
            if ack.duplicate:
                raise BackupError(name, f"the server took message seq {ack.seq} for a duplicate")
            if ack.seq <= last_seq:
                raise BackupError(name, "messages were stored out of order")
            last_seq = ack.seq
        pending.clear()

    with path.open("rb") as f:
        for rec in msgpack.Unpacker(f, raw=False, max_buffer_size=64 * 1024 * 1024):
            headers = replay_headers(rec.get("headers"))
            msg_id = (headers or {}).get("Nats-Msg-Id")
            if msg_id is not None:
                since = time.monotonic() - last_used.get(msg_id, -1e9)
                if since <= window_s * 1.5:
                    # Same id again inside the (shrunk) window: wait it out, or it would be dropped.
                    await drain()
                    await asyncio.sleep(window_s * 1.5 - since)
                last_used[msg_id] = time.monotonic()
            pending.append(await js.publish_async(rec["subject"], rec["data"] or b"", headers=headers))
            count += 1
            if len(pending) >= MAX_INFLIGHT:
                await drain()
    await drain()
    return count


async def restore(nc: Client, directory: Path, *, streams: Sequence[str] | None = None, replace: bool = False,
                  with_commands: bool = False, timeout_s: float = 10.0) -> list[Restored]:
    entries = read_manifest(directory)
    if streams is not None:
        unknown = sorted(set(streams) - {e.name for e in entries})
        if unknown:
            raise BackupError(unknown[0], "not in this backup")
        entries = [e for e in entries if e.name in set(streams)]
    return [await restore_stream(nc, directory, e, replace=replace, with_commands=with_commands,
                                 timeout_s=timeout_s) for e in entries]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mavjet restore",
        description="Restore a `mavjet backup` directory into a server (normally an empty one).",
    )
    natsconn.add_nats_arguments(p)
    p.add_argument("directory", type=Path, help="a directory written by `mavjet backup`")
    p.add_argument("--streams", help="comma-separated stream names (default: everything in the backup)")
    p.add_argument("--replace", action="store_true", help="delete streams that already hold messages first")
    p.add_argument("--with-commands", action="store_true",
                   help="also replay queued TWIN_CMD commands (a running gateway would execute them)")
    p.add_argument("--timeout", type=duration, default=10.0, help="wait this long for one server answer, e.g. 10s (default: 10s)")
    return p


async def run(args: argparse.Namespace) -> int:
    nc = await connect(args, name="mavjet-restore")
    started = time.monotonic()
    try:
        streams = [s.strip() for s in args.streams.split(",") if s.strip()] if args.streams else None
        done = await restore(nc, args.directory, streams=streams, replace=args.replace,
                             with_commands=args.with_commands, timeout_s=args.timeout)
    finally:
        await nc.close()
    for r in done:
        print(f"restored {r.name:16} {r.messages:>9} messages" + (f"  ({r.skipped})" if r.skipped else ""))
    print(f"restore complete in {time.monotonic() - started:.1f}s")
    return 0


def main(argv: list[str]) -> int:
    return run_cli(build_parser(), run, argv, errors=(OSError, ValueError))
