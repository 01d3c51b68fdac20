"""`mavjet logs ls/get VID`: a vehicle's flight logs, on the vehicle and in TWIN_LOGS.

`ls VID` sends the `log_list` command and shows the vehicle's own list
(LOG_ENTRY: id, size, date), each marked with whether it is already stored;
`ls VID --stored` lists the logs stored in TWIN_LOGS (`logs/<VID>/...`)
without asking the vehicle. `get VID
LOG_ID|latest [--out FILE]` sends the `log_download` command, follows its
`log_download_progress` events with a progress bar (plain lines when stderr
is not a terminal) and prints the stored object, its sha256 and the rate;
with `--out` it then fetches the object into FILE (sha256-checked,
resumable). The download itself runs in the gateway (docs/companion.md,
"Flight logs").
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
from nats.aio.client import Client
from nats.aio.msg import Msg
from rich.progress import Progress, TaskID

from mavjet.contract import natsconn
from mavjet.contract.commands import CommandName
from mavjet.contract.envelope import unpack
from mavjet.contract.events import EventType
from mavjet.contract.subjects import CMD_STREAM, LOGS_STREAM, STATE_STREAM, event_subject
from mavjet.gateway.stores import logstore
from mavjet.ops import console, resolve
from mavjet.ops.client import CommandClient, ResultTimeout
from mavjet.ops.resolve import connect
from mavjet.ops.runner import duration, run_cli

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_TIMEOUT = 0, 1, 2, 4
START_WAIT_S = 60.0  # `logs get`: for the download's start (its accepted result), and that command's deadline


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mavjet logs", description="A vehicle's dataflash logs: its own list (LOG_ENTRY), downloads into TWIN_LOGS.")
    sub = p.add_subparsers(dest="action", required=True)
    ls = sub.add_parser("ls", help="the logs VID holds (log_list), marked when stored; --stored: those in TWIN_LOGS")
    ls.add_argument("vid", help="the vehicle id")
    ls.add_argument("--stored", action="store_true", help="only the logs stored in TWIN_LOGS (the vehicle is not asked)")
    ls.add_argument("--timeout", type=duration, default=60.0, help="give up waiting for the vehicle after this long (30s, 2m; default 60s)")
    get = sub.add_parser("get", help="download a log from the vehicle into TWIN_LOGS (and --out FILE)")
    get.add_argument("vid", help="the vehicle id")
    get.add_argument("log", help="a log id, or latest")
    get.add_argument("--out", type=Path, help="also write the log to FILE (sha256 checked)")
    get.add_argument("--timeout", type=duration, default=1800.0, help="give up waiting after this long (default 30m)")
    get.add_argument("--quiet", action="store_true", help="no progress")
    for s in (ls, get):
        s.add_argument("--json", action="store_true", help="machine-readable output")
        natsconn.add_nats_arguments(s)
    return p


class Bar:
    """A rich progress bar on a terminal (bytes, speed, time left, a note such as "paused: armed"),
    a plain line per tenth elsewhere (a log file or a serial console reads those fine)."""

    def __init__(self, label: str, *, quiet: bool) -> None:
        self.label, self.quiet, self.tty = label, quiet, console.is_tty(sys.stderr)
        self.shown = -1
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def __call__(self, done: int, total: int, note: str = "") -> None:
        if self.quiet:
            return
        if self.tty:
            if self._progress is None:
                self._progress = console.transfer_bar(sys.stderr)
                self._progress.start()
                self._task = self._progress.add_task(self.label, total=total or None)
            assert self._task is not None
            self._progress.update(self._task, completed=done, total=total or None,
                                  description=f"{self.label} {note}".rstrip())
            return
        frac = 1.0 if total <= 0 else min(done / total, 1.0)
        tenth = int(frac * 10)
        if tenth != self.shown or note:
            self.shown = tenth
            print(f"{self.label}: {done}/{total} bytes ({tenth * 10}%) {note}".rstrip(), file=sys.stderr, flush=True)

    def end(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


async def ls(args: argparse.Namespace) -> int:
    nc = await connect(args, name="mavjet-logs")
    try:
        if args.stored:
            await resolve.require_env(nc.jetstream(), args.env, (LOGS_STREAM,))
            records = await logstore.list_logs(nc.jetstream(), args.env, args.vid)
            if not records:  # stored logs of a vehicle long gone are still its logs: only then is it looked up
                await resolve.vehicle(nc, args.env, args.vid, needs=(LOGS_STREAM, STATE_STREAM))
            if not records and not args.json:
                print(f"no logs of {args.vid} in TWIN_LOGS (mavjet logs ls {args.vid}: the vehicle's own list)",
                      file=sys.stderr)
            return _print_stored(records, as_json=args.json)
        await _served(nc, args, CommandName.LOG_LIST)
        records = await logstore.list_logs(nc.jetstream(), args.env, args.vid)
        async with CommandClient(nc, args.env, issuer="mavjet-logs") as client:
            # The deadline is the wait: a command nobody waits for any more is not started later.
            res = await client.call(args.vid, CommandName.LOG_LIST, {}, deadline_s=args.timeout, timeout_s=args.timeout)
    except ResultTimeout as exc:
        print(f"mavjet logs: {exc} (is a gateway serving {args.vid}?)", file=sys.stderr)
        return EXIT_TIMEOUT
    finally:
        await nc.close()
    if not res.accepted:
        print(f"mavjet logs: log_list {res.result}: {res.detail}", file=sys.stderr)
        return EXIT_TIMEOUT if res.result == "timeout" else EXIT_FAILED
    stored = {r.object: r for r in records}
    rows = []
    for e in res.data.get("logs") or []:
        rec = stored.get(str(e.get("object")))
        rows.append({**e, "stored": rec is not None, "sha256": rec.sha256 if rec else None})
    if args.json:
        print(json.dumps(rows))
        return EXIT_OK
    cells = [(str(r["log_id"]), f"{r['size_bytes']} B",
              datetime.fromtimestamp(int(r["time_utc_s"]), UTC).strftime("%Y-%m-%d %H:%M:%SZ")
              if r.get("time_utc_s") else "undated", "stored" if r["stored"] else "-") for r in rows]
    if console.is_tty():
        console.print_table(["LOG", "SIZE", "DATE (UTC)", "IN TWIN_LOGS"], cells, right=["LOG", "SIZE"],
                            title=f"logs on {args.vid}")
    else:
        print(f"{'LOG':>5}  {'SIZE':>13}  {'DATE (UTC)':<20}  IN TWIN_LOGS")
        for log_id, size, when, stored_mark in cells:
            print(f"{log_id:>5}  {size:>13}  {when:<20}  {stored_mark}")
    print(res.detail, file=sys.stderr)
    return EXIT_OK


def _print_stored(records: list[logstore.LogRecord], *, as_json: bool) -> int:
    rows = [{"object": r.object, "log_id": r.log_id, "bytes": r.size_bytes, "mtime": r.mtime, "sha256": r.sha256}
            for r in records]
    if as_json:
        print(json.dumps(rows))
    else:
        cells = [(str(r["object"]), f"{r['bytes']} B", str(r["sha256"])[:16], str(r["mtime"])) for r in rows]
        if console.is_tty():
            console.print_table(["OBJECT", "SIZE", "SHA256", "STORED AT"], cells, right=["SIZE"])
        elif cells:
            print(f"{'OBJECT':<48} {'SIZE':>13}  {'SHA256':<23}  STORED AT")
            for obj, size, sha, mtime in cells:
                print(f"{obj:<48} {size:>13}  sha256 {sha}  {mtime}")
    return EXIT_OK


async def _served(nc: Client, args: argparse.Namespace, command: str) -> None:
    """Refuse (one line, exit 2) a vehicle no gateway has registered, or whose gateway is gone: nobody would answer."""
    vehicle = await resolve.vehicle(nc, args.env, args.vid, needs=(CMD_STREAM, STATE_STREAM, LOGS_STREAM))
    resolve.require_served(vehicle, why=f"nobody would answer {command}")


async def _follow(nc: Client, args: argparse.Namespace, bar: Bar) -> dict[str, Any] | None:
    """Send log_download, follow its events; the last event (log_downloaded / _failed), or None when rejected."""
    final: list[tuple[str, dict[str, Any]]] = []
    done = anyio.Event()
    wanted: dict[str, int] = {}

    async def on_msg(msg: Msg) -> None:
        etype = msg.subject.rsplit(".", 1)[-1]
        data = unpack(msg.data).data
        if wanted and data.get("log_id") != wanted.get("log_id"):
            return
        if etype == EventType.LOG_DOWNLOAD_PROGRESS:
            bar(int(data.get("bytes", 0)), int(data.get("total", 0)), "(paused: armed)" if data.get("paused") else "")
        elif etype in (EventType.LOG_DOWNLOADED, EventType.LOG_DOWNLOAD_FAILED):
            final.append((etype, data))
            done.set()

    sub = await nc.subscribe(event_subject(args.env, args.vid, ">"), cb=on_msg)
    try:
        async with CommandClient(nc, args.env, issuer="mavjet-logs") as client:
            res = await client.call(args.vid, CommandName.LOG_DOWNLOAD, {"log": args.log}, deadline_s=START_WAIT_S,
                                    timeout_s=START_WAIT_S)
        if not res.accepted:
            print(f"mavjet logs: log_download {res.result}: {res.detail}", file=sys.stderr)
            return None
        wanted["log_id"] = int(res.data.get("log_id", 0))
        bar(0, int(res.data.get("total", 0)))
        with anyio.move_on_after(args.timeout):
            await done.wait()
    finally:
        await sub.unsubscribe()
    bar.end()
    if not final:
        return {"event": "timeout"}
    etype, data = final[0]
    return {"event": etype, **data}


async def get(args: argparse.Namespace) -> int:
    if args.log != "latest" and not args.log.isdigit():
        print("mavjet logs: LOG_ID must be a number or latest", file=sys.stderr)
        return EXIT_USAGE
    bar = Bar(f"log {args.log} of {args.vid}", quiet=args.quiet or args.json)
    nc = await connect(args, name="mavjet-logs")
    try:
        await _served(nc, args, CommandName.LOG_DOWNLOAD)
        try:
            out = await _follow(nc, args, bar)
        except ResultTimeout as exc:
            print(f"mavjet logs: {exc} (is a gateway serving {args.vid}?)", file=sys.stderr)
            return EXIT_TIMEOUT
        if out is None:
            return EXIT_FAILED
        if out["event"] != EventType.LOG_DOWNLOADED:
            print(f"mavjet logs: {out['event']}: {out.get('reason', 'no result in time')}", file=sys.stderr)
            return EXIT_TIMEOUT if out["event"] == "timeout" else EXIT_FAILED
        if args.out is not None:
            vid, name = logstore.split_object(str(out["object"]))
            t = await logstore.get_log(nc.jetstream(), args.env, vid, name, args.out)
            out["file"] = str(args.out)
            out["file_sha256"] = t.sha256
    finally:
        await nc.close()
    if args.json:
        print(json.dumps(out))
    else:
        where = f", written to {args.out}" if args.out is not None else ""
        print(f"stored {out['object']} ({out['size_bytes']} bytes, sha256 {str(out['sha256'])[:16]}, "
              f"{out['kib_s']} KiB/s){where}")
    return EXIT_OK


async def run(args: argparse.Namespace) -> int:
    return await {"ls": ls, "get": get}[args.action](args)


def main(argv: list[str]) -> int:
    return run_cli(build_parser(), run, argv, errors=(OSError,))
