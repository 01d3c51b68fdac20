"""`mavjet shadow`: read, write and watch a vehicle's shadow documents (TWIN_SHADOW).

    mavjet shadow get VID [--desired | --reported | --meta | --config]
    mavjet shadow set VID params.RTL_ALT=2000 mode=GUIDED armed=false   (merged into desired)
    mavjet shadow set VID --file desired.json                          (replaces desired)
    mavjet shadow edit VID      ($EDITOR; written only if nobody changed it meanwhile)
    mavjet shadow history VID [--reported]
    mavjet shadow watch VID
    mavjet shadow diff VID      (what has not converged, and why)

Documents are JSON. Writes to `desired` are checked against the schema first
(`--force` writes anyway: the gateway will report the problem in
`reported.delta`), and use the revision they were read at, so two operators
editing at once cannot silently overwrite each other. `reported` is the
gateway's: this tool never writes it. The vehicle is resolved first
(ops/resolve.py): an unknown one is refused in one line (`set`/`edit
--force` prepare desired for a vehicle not seen yet), and a write for one
whose gateway is gone says it applies when a gateway serves it again.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import anyio
import nats.errors
import nats.js.errors
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue

from mavjet.contract import natsconn
from mavjet.contract.errors import MavjetError
from mavjet.contract.subjects import (
    SHADOW_BUCKET,
    SHADOW_STREAM,
    STATE_STREAM,
    check_token,
    shadow_key,
    shadow_kv_subject,
)
from mavjet.gateway.shadow.document import parse_desired
from mavjet.ops import resolve
from mavjet.ops.console import is_tty, print_table
from mavjet.ops.resolve import connect
from mavjet.ops.runner import duration, run_cli

DOCS = ("desired", "reported", "meta", "config")


class UsageError(MavjetError):
    pass


def parse_value(text: str) -> Any:
    """A CLI value: JSON if it parses (numbers, true/false/null, objects), else the string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def apply_assignments(doc: dict[str, Any], assignments: list[str]) -> dict[str, Any]:
    """`a.b=value` into a copy of `doc`; `a.b=null` (or `a.b=`) removes the key."""
    change: dict[str, Any] = {}
    for a in assignments:
        path, sep, raw = a.partition("=")
        if not sep or not path.strip():
            raise UsageError(f"{a!r}: expected FIELD=VALUE, e.g. params.RTL_ALT=2000 or mode=GUIDED")
        change[path.strip()] = parse_value(raw) if raw.strip() else None
    return set_paths(doc, change)


def set_paths(doc: Mapping[str, Any] | None, change: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `doc` with each dotted `path: value` of `change` set (None removes it), in order."""
    out: dict[str, Any] = json.loads(json.dumps(dict(doc or {})))
    for path, value in change.items():
        keys = path.split(".")
        node = out
        for k in keys[:-1]:
            nxt = node.get(k)
            if not isinstance(nxt, dict):
                nxt = {}
                node[k] = nxt
            node = nxt
        if value is None:
            node.pop(keys[-1], None)
        else:
            node[keys[-1]] = value
    return out


def diff_lines(desired_rev: int, reported: dict[str, Any] | None) -> list[str]:
    """Human-readable: what has not converged and why (empty when converged)."""
    if reported is None:
        return ["no reported document yet: is a gateway serving this vehicle?"]
    lines: list[str] = []
    seen = reported.get("desired_revision")
    if seen != desired_rev:
        lines.append(f"the gateway has not applied desired revision {desired_rev} yet (reported is for {seen})")
    for path, d in sorted((reported.get("delta") or {}).items()):
        lines.append(
            f"{path}: desired {json.dumps(d.get('desired'))}, reported {json.dumps(d.get('reported'))}"
            f" — {d.get('reason')} (attempts {d.get('attempts', 0)}, since {d.get('since')})"
        )
    if reported.get("link") not in (None, "up"):
        lines.append(f"link: {reported.get('link')}")
    return lines


def _validate(doc_bytes: bytes, force: bool) -> None:
    d = parse_desired(doc_bytes, revision=0)
    if d.errors and not force:
        detail = "\n".join(f"  {p}: {r}" for p, r in sorted(d.errors.items()))
        raise UsageError(f"desired document is not valid (--force writes it anyway):\n{detail}")


async def _get(kv: KeyValue, key: str) -> tuple[int, Any]:
    try:
        e = await kv.get(key)
    except nats.js.errors.KeyNotFoundError:
        return 0, None
    try:
        return int(e.revision or 0), json.loads(e.value or b"null")
    except ValueError:
        return int(e.revision or 0), (e.value or b"").decode("utf-8", "replace")


async def _write_desired(kv: KeyValue, key: str, data: bytes, last: int) -> int:
    try:
        if last:
            return int(await kv.update(key, data, last=last))
        return int(await kv.create(key, data))
    except nats.js.errors.KeyWrongLastSequenceError:
        raise UsageError("desired changed since it was read (someone else wrote it); read it again and retry") from None


def _dump(doc: Any) -> str:
    return json.dumps(doc, indent=2, sort_keys=True)


async def run(args: argparse.Namespace) -> int:
    check_token("vid", args.vid)
    nc = await connect(args, name="mavjet-shadow")
    try:
        writes = args.action in ("set", "edit")
        # Writing desired for a vehicle not seen yet is how one is prepared: --force says it is meant.
        vehicle = await resolve.vehicle(nc, args.env, args.vid, needs=(SHADOW_BUCKET, STATE_STREAM),
                                        force="write desired for it anyway" if writes else "",
                                        allow_unknown=writes and args.force)
        js = nc.jetstream()
        kv = await js.key_value(SHADOW_BUCKET)
        return await _dispatch(args, kv, js, vehicle)
    finally:
        await nc.close()


def _written(vehicle: resolve.Vehicle, new: int, was: str = "") -> None:
    """The line a write prints, and whether anyone will apply it soon."""
    print(f"desired revision {new}{was}")
    if vehicle.gone:
        print(f"mavjet shadow: warning: {vehicle.gone_text()}: desired revision {new} is stored and applies when "
              f"a gateway serves {vehicle.vid} again", file=sys.stderr)
    elif not vehicle.known:
        print(f"mavjet shadow: warning: no gateway has registered {vehicle.vid} yet: desired revision {new} is "
              "stored and applies when one serves it", file=sys.stderr)


async def _dispatch(args: argparse.Namespace, kv: KeyValue, js: JetStreamContext, vehicle: resolve.Vehicle) -> int:
    key = {d: shadow_key(args.env, args.vid, d) for d in DOCS}
    if args.action == "get":
        which = [d for d in DOCS if getattr(args, d, False)] or ["desired", "reported"]
        out: dict[str, Any] = {}
        for d in which:
            rev, doc = await _get(kv, key[d])
            out[d] = {"revision": rev, "value": doc}
        # The plain form is already JSON (one document bare); --json is always {doc: {revision, value}}.
        print(_dump(out if args.json or len(which) > 1 else out[which[0]]["value"]))
        return 0
    if args.action == "set":
        rev, cur = await _get(kv, key["desired"])
        if args.file is not None:
            if args.assignments:
                raise UsageError("give either --file or FIELD=VALUE assignments, not both")
            data = await anyio.Path(args.file).read_bytes() if args.file != "-" else sys.stdin.buffer.read()
        else:
            if not args.assignments:
                raise UsageError("nothing to set: give FIELD=VALUE ... or --file desired.json")
            base = cur if isinstance(cur, dict) and not args.replace else {}
            data = json.dumps(apply_assignments(base, args.assignments), indent=2, sort_keys=True).encode()
        _validate(data, args.force)
        new = await _write_desired(kv, key["desired"], data, rev)
        _written(vehicle, new)
        return 0
    if args.action == "edit":
        rev, cur = await _get(kv, key["desired"])
        text = _dump(cur if cur is not None else {}) + "\n"
        with tempfile.NamedTemporaryFile("w+", suffix=".json", prefix=f"{args.vid}-desired-", delete=False) as f:
            f.write(text)
            path = f.name
        try:
            editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
            proc = await asyncio.create_subprocess_exec(*shlex.split(editor), path)
            if await proc.wait() != 0:
                raise UsageError(f"{editor} exited with {proc.returncode}; nothing written")
            new_text = await anyio.Path(path).read_text()
        finally:
            await anyio.Path(path).unlink(missing_ok=True)
        if new_text.strip() == text.strip():
            print("no change")
            return 0
        _validate(new_text.encode(), args.force)
        new = await _write_desired(kv, key["desired"], new_text.encode(), rev)
        _written(vehicle, new, f" (was {rev})")
        return 0
    if args.action == "history":
        k = key["reported" if args.reported else "desired"]
        entries = await _history(js, k)
        if not entries:
            print(f"no history for {k}", file=sys.stderr)
            return 1
        if args.json:
            print(json.dumps([_history_doc(e) for e in entries], indent=2, default=str))
            return 0
        if is_tty():
            print_table(["REVISION", "CREATED", "VALUE"],
                        [[str(e.revision), str(e.created or ""), _body(e)] for e in entries], right=["REVISION"])
            return 0
        for e in entries:
            when = e.created if e.created is not None else ""
            body = "(deleted)" if e.operation in ("DEL", "PURGE") else (e.value or b"").decode("utf-8", "replace")
            print(f"revision {e.revision}  {when}  {body}")
        return 0
    if args.action == "watch":
        return await _watch(args, kv, key)
    if args.action == "diff":
        rev, _ = await _get(kv, key["desired"])
        _, rep = await _get(kv, key["reported"])
        lines = diff_lines(rev, rep if isinstance(rep, dict) else None)
        if vehicle.gone:
            lines.append(f"{vehicle.gone_text()}: nothing converges until a gateway serves it again")
        if args.json:
            reported = rep if isinstance(rep, dict) else None
            print(json.dumps({
                "converged": not lines, "desired_revision": rev,
                "applied_revision": None if reported is None else reported.get("desired_revision"),
                "delta": {} if reported is None else reported.get("delta") or {},
                "link": None if reported is None else reported.get("link"), "problems": lines,
            }, indent=2, sort_keys=True, default=str))
            return 0 if not lines else 1
        if not lines:
            print(f"converged at desired revision {rev}")
            return 0
        print("\n".join(lines))
        return 1
    raise UsageError(f"unknown action {args.action}")


@dataclass(frozen=True, slots=True, kw_only=True)
class _Revision:
    revision: int
    created: datetime | None
    operation: str | None  # KV-Operation: None for a put, DEL or PURGE
    value: bytes | None


async def _history(js: JetStreamContext, key: str) -> list[_Revision]:
    """A key's kept revisions, oldest first, read one stored message after another.

    Not `KeyValue.history`: on a loaded machine its watcher can say "no more"
    before its callback has seen what the server already pushed (consumer
    info then counts 0 pending and 0 delivered), and a key with history comes
    back empty. Gets by subject from a sequence on do not race.
    """
    subject = shadow_kv_subject(key)
    entries: list[_Revision] = []
    seq = 1
    for _ in range(10_000):  # the bucket keeps a few revisions a key; this only bounds the loop
        try:
            msg = await js.get_msg(SHADOW_STREAM, seq=seq, subject=subject, next=True)
        except nats.js.errors.NotFoundError:
            break
        if msg.seq is None:
            break
        entries.append(_Revision(revision=msg.seq, created=msg.time, value=msg.data,
                                 operation=(msg.headers or {}).get("KV-Operation")))
        seq = msg.seq + 1
    return entries


def _body(e: Any) -> str:
    return "(deleted)" if e.operation in ("DEL", "PURGE") else (e.value or b"").decode("utf-8", "replace")


def _history_doc(e: Any) -> dict[str, Any]:
    value: Any = None
    if e.operation not in ("DEL", "PURGE"):
        try:
            value = json.loads(e.value or b"null")
        except ValueError:
            value = (e.value or b"").decode("utf-8", "replace")
    return {"revision": e.revision, "created": e.created, "operation": e.operation or "PUT", "value": value}


async def _watch(args: argparse.Namespace, kv: KeyValue, key: dict[str, str]) -> int:
    watcher: Any = await kv.watch(f"fleet.{args.env}.veh.{args.vid}.*")
    seen = 0
    try:
        while args.count is None or seen < args.count:
            try:
                e = await watcher.updates(timeout=args.timeout)
            except nats.errors.TimeoutError:
                if args.count is not None:
                    return 1
                continue
            if e is None:
                continue
            seen += 1
            doc = e.key.rsplit(".", 1)[-1]
            try:
                value = json.loads(e.value or b"null")
            except ValueError:
                value = (e.value or b"").decode("utf-8", "replace")
            if args.json:
                print(json.dumps({"doc": doc, "revision": e.revision, "value": value}, sort_keys=True), flush=True)
            elif doc == "reported" and isinstance(value, dict):
                delta = ", ".join(f"{p}: {d.get('reason')}" for p, d in (value.get("delta") or {}).items())
                print(f"reported r{e.revision} desired_revision={value.get('desired_revision')} "
                      f"converged={value.get('converged')} link={value.get('link')}" + (f" delta: {delta}" if delta else ""),
                      flush=True)
            else:
                print(f"{doc} r{e.revision} {json.dumps(value, sort_keys=True)}", flush=True)
    finally:
        await watcher.stop()
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mavjet shadow", description="Read, write and watch shadow documents.",
                                epilog="Desired document fields: docs/shadow.md.")
    sub = p.add_subparsers(dest="action", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("vid", help="vehicle id, e.g. VID-001")
        natsconn.add_nats_arguments(sp)

    g = sub.add_parser("get", help="print shadow documents (default: desired and reported)")
    common(g)
    g.add_argument("--json", action="store_true", help="always {doc: {revision, value}} (for scripts)")
    for doc in DOCS:
        g.add_argument(f"--{doc}", action="store_true", help=f"only {doc}")
    s = sub.add_parser("set", help="write desired: FIELD=VALUE ... merged in, or --file replaces it")
    common(s)
    s.add_argument("assignments", nargs="*", metavar="FIELD=VALUE",
                   help="e.g. params.RTL_ALT=2000 mode=GUIDED armed=false; FIELD= removes it")
    s.add_argument("--file", help="a whole desired document (JSON), - for stdin")
    s.add_argument("--replace", action="store_true", help="start from an empty document instead of the current one")
    s.add_argument("--force", action="store_true",
                   help="write even if the document does not validate, or no gateway has registered the vehicle yet")
    e = sub.add_parser("edit", help="edit desired in $EDITOR; written with a revision check")
    common(e)
    e.add_argument("--force", action="store_true",
                   help="write even if the document does not validate, or no gateway has registered the vehicle yet")
    h = sub.add_parser("history", help="the revisions kept (history 5)")
    common(h)
    h.add_argument("--reported", action="store_true", help="reported's history instead of desired's")
    h.add_argument("--json", action="store_true", help="a JSON list of {revision, created, operation, value}")
    w = sub.add_parser("watch", help="print desired/reported/meta/config changes as they happen")
    common(w)
    w.add_argument("--count", type=int, help="exit after this many updates")
    w.add_argument("--json", action="store_true", help="one JSON line per update: {doc, revision, value}")
    w.add_argument("--timeout", type=duration, default=30.0, help="with --count: give up after this long idle, e.g. 30s (default: 30s)")
    d = sub.add_parser("diff", help="what has not converged, and why (exit 1 if anything)")
    common(d)
    d.add_argument("--json", action="store_true", help="converged, revisions, delta and the problems as JSON")
    return p


def main(argv: list[str]) -> int:
    return run_cli(build_parser(), run, argv, errors=(OSError, subprocess.SubprocessError))
