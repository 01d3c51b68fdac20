"""`mavjet backup --out DIR`: the twin's streams, configs and contents, to files.

Seed 000's backup table asks for stream snapshots, KV key export and object
store backups. All five twin resources are streams underneath (KV_TWIN_SHADOW
keeps every revision of a key in its history, OBJ_TWIN_BLOBS stores chunks and
metadata as messages), so one format covers them all and keeps KV history and
objects byte-exact:

    DIR/manifest.json          written last: its presence means "complete"
    DIR/<STREAM>.config.json   the stream config exactly as the server reports it
    DIR/<STREAM>.msgs          msgpack records, in sequence order:
                               {"seq", "subject", "time_ns", "headers", "data"}

Reading uses one ordered push consumer per stream with a callback (the
fastest way to read a stream from nats-py), up to the last
sequence seen when the backup of that stream started. A workqueue stream
(TWIN_CMD) admits no such consumer next to the gateway's, and consuming would
remove the commands, so it is read message by message with the direct-get API
(it holds at most five minutes of commands). Configs are read through the raw
JetStream API so fields nats-py does not model survive the trip.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime as dt
import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import msgpack
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import api as jsapi

from mavjet.contract import natsconn
from mavjet.contract.errors import MavjetError
from mavjet.ops.health import is_twin_stream
from mavjet.ops.resolve import connect
from mavjet.ops.runner import duration, run_cli

FORMAT = "mavjet-backup"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"


class BackupError(MavjetError):
    """A backup or restore could not be completed; `stream` names the one at fault."""

    def __init__(self, stream: str, reason: str) -> None:
        super().__init__(f"{stream}: {reason}" if stream else reason)
        self.stream = stream
        self.reason = reason


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamEntry:
    """One stream in a manifest."""

    name: str
    messages: int
    first_seq: int
    last_seq: int
    bytes: int
    sha256: str

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "messages": self.messages, "first_seq": self.first_seq,
                "last_seq": self.last_seq, "bytes": self.bytes, "sha256": self.sha256}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> StreamEntry:
        return cls(name=str(raw["name"]), messages=int(raw["messages"]), first_seq=int(raw["first_seq"]),
                   last_seq=int(raw["last_seq"]), bytes=int(raw["bytes"]), sha256=str(raw["sha256"]))


def config_path(directory: Path, stream: str) -> Path:
    return directory / f"{stream}.config.json"


def messages_path(directory: Path, stream: str) -> Path:
    return directory / f"{stream}.msgs"


def encode_record(seq: int, subject: str, time_ns: int, headers: dict[str, str] | None, data: bytes) -> bytes:
    return msgpack.packb(
        {"seq": seq, "subject": subject, "time_ns": time_ns, "headers": headers or None, "data": data},
        use_bin_type=True,
    )


def reply_time_ns(reply: str) -> int:
    """The stored time of a message, in ns, from its JetStream ack subject."""
    tokens = reply.split(".")
    # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<tm>.<pending> (9 tokens), or the
    # v2 form with <domain>.<account hash> after ACK (11 tokens, 12 with a trailing token).
    idx = 7 if len(tokens) == 9 else 9
    return int(tokens[idx])


def parse_headers(raw: bytes) -> dict[str, str] | None:
    """Pure: a stored NATS header block ("NATS/1.0" then "Key: value" lines) -> dict."""
    lines = raw.decode("utf-8", "replace").split("\r\n")
    out: dict[str, str] = {}
    for line in lines[1:]:
        key, sep, value = line.partition(":")
        if sep and key:
            out.setdefault(key.strip(), value.strip())
    return out or None


def rfc3339_ns(text: str) -> int:
    """Pure: '2026-01-02T03:04:05.123456789Z' -> ns since the epoch, keeping all nine digits."""
    head, _, frac = text.rstrip("Z").partition(".")
    base = dt.datetime.fromisoformat(head).replace(tzinfo=dt.UTC)
    return int(base.timestamp()) * 1_000_000_000 + int((frac + "000000000")[:9] or 0)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


async def api_request(nc: Client, subject: str, body: dict[str, Any] | None = None,
                      *, timeout_s: float = 5.0, prefix: str = "$JS.API") -> dict[str, Any]:
    """A raw JetStream API call; raises BackupError with the server's description."""
    payload = json.dumps(body).encode() if body is not None else b""
    msg = await nc.request(f"{prefix}.{subject}", payload, timeout=timeout_s)
    resp: dict[str, Any] = json.loads(msg.data)
    if "error" in resp:
        err = resp["error"]
        raise BackupError("", f"{subject}: {err.get('description', err)} (err_code {err.get('err_code')})")
    return resp


async def list_streams(nc: Client, *, timeout_s: float) -> list[str]:
    names: list[str] = []
    for _ in range(1000):
        resp = await api_request(nc, "STREAM.NAMES", {"offset": len(names)}, timeout_s=timeout_s)
        page = resp.get("streams") or []
        names.extend(page)
        if not page or len(names) >= int(resp.get("total", 0)):
            break
    return sorted(names)


class _StreamReader:
    """Copies one stream into a records file with an ordered consumer."""

    def __init__(self, out: IO[bytes], last_seq: int) -> None:
        self.out = out
        self.last_seq = last_seq
        self.count = 0
        self.first_seq = 0
        self.seen_seq = 0
        self.done = asyncio.Event()
        self.progress = asyncio.Event()

    async def on_msg(self, msg: Msg) -> None:
        if self.done.is_set() or not msg.reply:
            return
        meta = msg.metadata
        seq = meta.sequence.stream
        if seq > self.last_seq:
            self.done.set()
            return
        self.out.write(encode_record(seq, msg.subject, reply_time_ns(msg.reply), msg.headers, msg.data))
        self.count += 1
        self.first_seq = self.first_seq or seq
        self.seen_seq = seq
        self.progress.set()
        if seq >= self.last_seq or meta.num_pending == 0:
            self.done.set()


async def _copy_by_get(nc: Client, name: str, reader: _StreamReader, first_seq: int, *,
                       timeout_s: float) -> None:
    """Copy a stream by direct gets of the next stored message (no consumer)."""
    seq = first_seq
    while seq <= reader.last_seq:
        try:
            resp = await api_request(nc, f"STREAM.MSG.GET.{name}", {"seq": seq, "next_by_subj": ">"},
                                     timeout_s=timeout_s)
        except BackupError as exc:
            if "no message found" in exc.reason:
                break
            raise BackupError(name, exc.reason) from exc
        m = resp["message"]
        mseq = int(m["seq"])
        if mseq > reader.last_seq:
            break
        headers = parse_headers(base64.b64decode(m["hdrs"])) if m.get("hdrs") else None
        data = base64.b64decode(m["data"]) if m.get("data") else b""
        reader.out.write(encode_record(mseq, m["subject"], rfc3339_ns(m["time"]), headers, data))
        reader.count += 1
        reader.first_seq = reader.first_seq or mseq
        reader.seen_seq = mseq
        seq = mseq + 1


async def backup_stream(nc: Client, name: str, directory: Path, *, timeout_s: float) -> StreamEntry:
    info = await api_request(nc, f"STREAM.INFO.{name}", timeout_s=timeout_s)
    config_path(directory, name).write_text(json.dumps(info["config"], indent=2, sort_keys=True) + "\n")
    state = info.get("state", {})
    last_seq = int(state.get("last_seq", 0))
    path = messages_path(directory, name)
    with path.open("wb") as out:
        reader = _StreamReader(out, last_seq)
        if int(state.get("messages", 0)) > 0 and info["config"].get("retention") == "workqueue":
            await _copy_by_get(nc, name, reader, int(state.get("first_seq", 1)), timeout_s=timeout_s)
        elif int(state.get("messages", 0)) > 0:
            js = nc.jetstream(timeout=timeout_s)
            sub = await js.subscribe(
                "", stream=name, cb=reader.on_msg, ordered_consumer=True,
                config=jsapi.ConsumerConfig(deliver_policy=jsapi.DeliverPolicy.ALL),
                pending_bytes_limit=256 * 1024 * 1024,
            )
            try:
                while not reader.done.is_set():
                    reader.progress.clear()
                    seen = reader.count
                    done_wait = asyncio.ensure_future(reader.done.wait())
                    prog_wait = asyncio.ensure_future(reader.progress.wait())
                    try:
                        await asyncio.wait({done_wait, prog_wait}, timeout=timeout_s,
                                           return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        done_wait.cancel()
                        prog_wait.cancel()
                    if not reader.done.is_set() and reader.count == seen:
                        raise BackupError(name, f"no message for {timeout_s:.0f}s after seq {reader.seen_seq} "
                                                f"(stream ends at {last_seq})")
            finally:
                await sub.unsubscribe()
    return StreamEntry(name=name, messages=reader.count, first_seq=reader.first_seq or int(state.get("first_seq", 0)),
                       last_seq=reader.seen_seq or last_seq, bytes=path.stat().st_size, sha256=file_sha256(path))


def prepare_directory(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    if any(directory.iterdir()):
        raise BackupError("", f"{directory} is not empty: back up into a new directory")


async def backup(nc: Client, directory: Path, *, streams: Sequence[str] | None = None,
                 timeout_s: float = 10.0) -> list[StreamEntry]:
    """Back up the named streams (default: every twin stream) into `directory`."""
    await asyncio.to_thread(prepare_directory, directory)
    available = await list_streams(nc, timeout_s=timeout_s)
    if streams is None:
        names = [s for s in available if is_twin_stream(s)]
    else:
        missing = sorted(set(streams) - set(available))
        if missing:
            raise BackupError(missing[0], "no such stream on the server")
        names = list(streams)
    if not names:
        raise BackupError("", "no TWIN_* streams on the server (is it provisioned?)")
    entries = [await backup_stream(nc, n, directory, timeout_s=timeout_s) for n in names]
    manifest = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "streams": [e.as_dict() for e in entries],
    }
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return entries


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mavjet backup",
        description="Back up the twin's streams (TWIN_STATE, TWIN_EVENTS, TWIN_CMD), the shadow KV with its "
        "history and the blob object store: configs and every message with subject, headers and payload. "
        "Restore with `mavjet restore DIR`.",
    )
    natsconn.add_nats_arguments(p)
    p.add_argument("--out", type=Path, required=True, help="a new, empty directory")
    p.add_argument("--streams", help="comma-separated stream names (default: every TWIN_* stream)")
    p.add_argument("--timeout", type=duration, default=10.0, help="give up after this long without progress, e.g. 10s (default: 10s)")
    return p


async def run(args: argparse.Namespace) -> int:
    nc = await connect(args, name="mavjet-backup")
    started = time.monotonic()
    try:
        streams = [s.strip() for s in args.streams.split(",") if s.strip()] if args.streams else None
        entries = await backup(nc, args.out, streams=streams, timeout_s=args.timeout)
    finally:
        await nc.close()
    for e in entries:
        print(f"backed up {e.name:16} {e.messages:>9} messages  seq {e.first_seq}..{e.last_seq}  {e.bytes} bytes")
    print(f"backup complete in {time.monotonic() - started:.1f}s: {args.out}")
    return 0


def main(argv: list[str]) -> int:
    return run_cli(build_parser(), run, argv)
