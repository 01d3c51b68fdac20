"""`mavjet blobs ls/get/put`: hash-addressed, resumable artifacts in TWIN_BLOBS.

`put FILE [--name logs/x.bin]` stores the file once as `sha256/<hex>` and
points the name at it; `get NAME [-o FILE]` downloads into FILE.part and
renames it once the sha256 matches. Both resume where an interrupted run
stopped (within one run, after a dropped connection, up to `--retries`
times; across runs, from the stream or the local journal). The protocol is in
gateway/stores/blobs.py and docs/companion.md ("Artifacts").
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import anyio
from nats.js import JetStreamContext

from mavjet.contract import natsconn
from mavjet.contract.commands import OBJECT_NAME
from mavjet.gateway.stores import blobs
from mavjet.gateway.stores.chunks import (
    HASH_PREFIX,
    BlobError,
    BlobFailure,
    Source,
    Transfer,
    content_name,
    object_digest,
)
from mavjet.ops.console import is_tty, print_table, transfer_progress
from mavjet.ops.resolve import Refused, connect
from mavjet.ops.runner import run_cli

T = TypeVar("T")
RETRYABLE = (BlobFailure.NOT_CONNECTED, BlobFailure.UNREADABLE, BlobFailure.UNWRITABLE)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mavjet blobs", description="Hash-addressed, resumable artifacts in TWIN_BLOBS.")
    sub = p.add_subparsers(dest="action", required=True)
    ls = sub.add_parser("ls", help="list objects and the names that point at them")
    ls.add_argument("prefix", nargs="?", default="", help="only names starting with this (e.g. logs/VID-001/)")
    put = sub.add_parser("put", help="store a file once by sha256, resuming an interrupted upload")
    put.add_argument("file", type=Path, help="the file to store")
    put.add_argument("--name", help="a name pointing at the content (e.g. logs/VID-001/3.bin)")
    get = sub.add_parser("get", help="download an object, resuming an interrupted download")
    get.add_argument("name", help="a name or sha256/<hex>")
    get.add_argument("-o", "--output", type=Path, help="file to write (default: the name's last part)")
    for s in (put, get):
        s.add_argument("--retries", type=int, default=3, help="reconnect and resume this many times (default 3)")
        s.add_argument("--quiet", action="store_true", help="no progress lines")
    for s in (ls, put, get):
        s.add_argument("--json", action="store_true", help="machine-readable output")
        natsconn.add_nats_arguments(s)
    return p


def _doc(t: Transfer, **extra: object) -> dict[str, object]:
    return {"object": t.name, "sha256": t.sha256, "bytes": t.size_bytes, "chunks": t.chunks,
            "sent_chunks": t.sent_chunks, "sent_bytes": t.sent_bytes, "resumed_at_chunk": t.resumed_at_chunk,
            "already_present": t.already_present, **extra}  # fmt: skip


async def _with_retries(args: argparse.Namespace, attempt: Callable[[JetStreamContext], Awaitable[T]]) -> T:
    """Run `attempt(js)` with a fresh connection, reconnecting after a retryable failure."""
    tries = 0
    while True:
        try:
            nc = await connect(args, name="mavjet-blobs")
        except Exception as exc:  # an unreachable server counts as one failed try
            if tries >= args.retries or (tries == 0 and isinstance(exc, Refused)):
                raise  # nothing listens there: retrying a first connect would only wait
            print(f"mavjet blobs: {exc}; retrying", file=sys.stderr)
        else:
            try:
                return await attempt(nc.jetstream())
            except BlobError as exc:
                if exc.kind not in RETRYABLE or tries >= args.retries:
                    raise
                print(f"mavjet blobs: {exc}; resuming", file=sys.stderr)
            finally:
                await nc.close()
        tries += 1
        await anyio.sleep(min(2.0**tries, 30.0))


async def put(args: argparse.Namespace) -> int:
    if args.name and (not OBJECT_NAME.match(args.name) or ".." in args.name or args.name.startswith(HASH_PREFIX)):
        print(f"mavjet blobs: {args.name!r} is not a valid name (e.g. logs/VID-001/3.bin)", file=sys.stderr)
        return 2
    data: Path = args.file
    if not await anyio.Path(data).is_file():
        print(f"mavjet blobs: {data}: not a readable file", file=sys.stderr)
        return 2
    # Checked first: a file already stored shows no progress bar (it used to show 100% and then
    # "already stored, nothing sent"); put_blob then only links the name.
    present = await _with_retries(args, lambda js: _stored(js, data))
    with transfer_progress(f"put {args.file.name}", quiet=args.quiet or args.json or present) as progress:

        async def attempt(js: JetStreamContext) -> Transfer:
            return await blobs.put_blob(js, data, alias=args.name, progress=progress)

        t = await _with_retries(args, attempt)
    if args.json:
        print(json.dumps(_doc(t, name=args.name)))
    else:
        how = "already stored, nothing sent" if t.already_present else f"sent {t.sent_chunks}/{t.chunks} chunks"
        alias = f" as {args.name}" if args.name else ""
        print(f"stored {t.name}{alias} ({t.size_bytes} bytes, {how})")
    return 0


async def _stored(js: JetStreamContext, data: Path) -> bool:
    """Whether TWIN_BLOBS already holds this file's content (by its sha256); the put itself reports any error."""
    hex_ = await Source(data).sha256()
    try:
        existing = await blobs.info(js, content_name(hex_))
    except Exception:  # nats-py raises a wide range; the upload that follows says what is wrong
        return False
    return existing is not None and existing.get("digest") == object_digest(hex_)


async def get(args: argparse.Namespace) -> int:
    dest: Path = args.output or Path(args.name.rsplit("/", 1)[-1])
    with transfer_progress(f"get {args.name}", quiet=args.quiet or args.json) as progress:

        async def attempt(js: JetStreamContext) -> Transfer:
            return await blobs.get_blob(js, args.name, dest, progress=progress)

        t = await _with_retries(args, attempt)
    if args.json:
        print(json.dumps(_doc(t, file=str(dest))))
    else:
        resumed = f", resumed at chunk {t.resumed_at_chunk}" if t.resumed_at_chunk else ""
        print(f"wrote {dest} ({t.size_bytes} bytes, sha256 {t.sha256[:16]} verified{resumed})")
    return 0


async def ls(args: argparse.Namespace) -> int:
    nc = await connect(args, name="mavjet-blobs")
    try:
        docs = await blobs.list_records(nc.jetstream(), args.prefix)
    finally:
        await nc.close()
    rows = []
    for d in docs:
        target = ((d.get("options") or {}).get("link") or {}).get("name") or ""
        sha = ((d.get("headers") or {}).get(blobs.SHA_HEADER) or [""])[0]
        rows.append({"object": d["name"], "bytes": d.get("size") or 0, "sha256": sha, "link": target,
                     "mtime": d.get("mtime") or ""})  # fmt: skip
    if args.json:
        print(json.dumps(rows))
        return 0
    if is_tty():
        print_table(["OBJECT", "BYTES", "SHA256 / LINK", "MTIME"],
                    [[_short(str(r["object"])), f"{r['bytes']:,}",
                      f"-> {_short(str(r['link']))}" if r["link"] else str(r["sha256"])[:16],
                      str(r["mtime"])[:19]] for r in rows], right=["BYTES"])
        return 0
    for r in rows:
        what = f"-> {r['link']}" if r["link"] else (f"sha256 {str(r['sha256'])[:16]}" if r["sha256"] else "")
        print(f"{r['object']:<48} {r['bytes']:>11} B  {what}")
    return 0


def _short(name: str) -> str:
    """`sha256/<64 hex>` as `sha256/<16 hex>…` on a terminal: enough to tell objects apart."""
    return name[: len(HASH_PREFIX) + 16] + "…" if name.startswith(HASH_PREFIX) else name


async def run(args: argparse.Namespace) -> int:
    action = {"ls": ls, "put": put, "get": get}[args.action]
    return await action(args)


def main(argv: list[str]) -> int:
    return run_cli(build_parser(), run, argv, errors=(OSError,))
