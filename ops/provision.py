"""`mavjet provision`: create or update the twin's JetStream resources.

The definitions are data in `deploy/jetstream/*.json`. Planning is pure
(`plan_stream` compares a desired config with the live one); applying is the
only part that talks to the server. Idempotent: a second run reports
"unchanged" for everything.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nats.js import JetStreamContext
from nats.js import api as jsapi
from nats.js.errors import NotFoundError

from mavjet.contract import natsconn
from mavjet.contract.errors import MavjetError
from mavjet.contract.subjects import check_token
from mavjet.contract.units import parse_duration_s, parse_size_bytes
from mavjet.ops.reserve import SIZES, add_stream_retrying, headroom_bytes, human_bytes, reservable
from mavjet.ops.resolve import connect
from mavjet.ops.runner import run_cli


def _definitions_dir() -> Path:
    """`deploy/jetstream` in a checkout; `<prefix>/share/mavjet/jetstream` in a wheel install."""
    repo = Path(__file__).resolve().parents[1] / "deploy" / "jetstream"
    if repo.is_dir():
        return repo
    return Path(sys.prefix) / "share" / "mavjet" / "jetstream"


DEFINITIONS_DIR = _definitions_dir()

# Fields JetStream refuses to change on an existing stream. A difference in
# one of these is a conflict the operator must resolve by hand.
IMMUTABLE = ("retention", "storage")
# Fields provisioning keeps in step with the definition.
MANAGED = (
    "subjects", "description", "max_age", "max_bytes", "max_msg_size", "max_msgs_per_subject",
    "discard", "duplicate_window", "allow_rollup_hdrs", "allow_direct", "num_replicas", "max_consumers",
)


class ProvisionConflict(MavjetError):
    """An existing resource differs in a way JetStream cannot update in place."""

    def __init__(self, resource: str, field_name: str, live: Any, wanted: Any) -> None:
        super().__init__(
            f"{resource}: {field_name} is {live!r} on the server but the definition wants {wanted!r}; "
            f"JetStream cannot change {field_name} in place (back up, delete and re-provision, "
            "see docs/operations.md)"
        )
        self.resource = resource
        self.field_name = field_name
        self.live = live
        self.wanted = wanted


@dataclass(frozen=True, slots=True, kw_only=True)
class Definition:
    kind: str  # stream | kv | object_store
    name: str  # resource name as users know it (stream or bucket)
    stream_name: str  # the backing stream
    config: jsapi.StreamConfig
    chunk_size_bytes: int = 128 * 1024


@dataclass(slots=True, kw_only=True)
class Action:
    resource: str
    verb: str  # create | update | unchanged | conflict
    changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    detail: str = ""

    def describe(self) -> str:
        if self.verb == "update":
            parts = ", ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in ((k, *v) for k, v in self.changes.items()))
            return f"{self.verb:9} {self.resource} ({parts})"
        return f"{self.verb:9} {self.resource}{' ' + self.detail if self.detail else ''}"


def _stream_config(raw: dict[str, Any], env: str, replicas: int) -> jsapi.StreamConfig:
    return jsapi.StreamConfig(
        name=raw["name"],
        description=raw.get("description"),
        subjects=[s.replace("{env}", env) for s in raw["subjects"]],
        retention=jsapi.RetentionPolicy(raw.get("retention", "limits")),
        storage=jsapi.StorageType(raw.get("storage", "file")),
        max_age=parse_duration_s(raw["max_age"]) if "max_age" in raw else None,
        max_bytes=parse_size_bytes(raw["max_bytes"]) if "max_bytes" in raw else -1,
        # nats-server 2.15 caps a stream whose max_consumers is unset at 1,000 consumers;
        # TWIN_CMD has one durable consumer per vehicle, so it names its own limit.
        max_consumers=int(raw.get("max_consumers", -1)),
        # A latest-wins stream that keeps one sample per subject (a hub's TWIN_DIGEST, deploy/central/).
        max_msgs_per_subject=int(raw.get("max_msgs_per_subject", -1)),
        discard=jsapi.DiscardPolicy(raw.get("discard", "old")),
        duplicate_window=parse_duration_s(raw.get("duplicate_window", "2m")),
        allow_rollup_hdrs=bool(raw.get("allow_rollup_hdrs", False)),
        allow_direct=bool(raw.get("allow_direct", False)),
        num_replicas=replicas,
    )


def load_definitions(
    directory: Path, *, env: str, replicas: int, size: str | None = None, max_bytes: dict[str, int] | None = None
) -> list[Definition]:
    """Read every `*.json` definition in `directory` for one environment.

    `size` scales the reservations to a preset (ops/reserve.py SIZES);
    `max_bytes` sets them per resource (`TWIN_EVENTS`, `TWIN_STATE`,
    `TWIN_BLOBS`, `TWIN_LOGS`), after the preset.
    """
    defs = _load(directory, env=env, replicas=replicas)
    if size is not None and size not in SIZES:
        raise MavjetError(f"size must be one of {', '.join(SIZES)}, not {size!r}")
    wanted = dict(SIZES.get(size or "large", {}))
    known = {d.name: d.stream_name for d in defs}
    for name, n in (max_bytes or {}).items():
        if name not in known and name not in known.values():
            raise MavjetError(f"--max-bytes {name}: no such resource (one of {', '.join(sorted(known))})")
        wanted[known.get(name, name)] = n
    return [dataclasses.replace(d, config=dataclasses.replace(d.config, max_bytes=wanted[d.stream_name]))
            if d.stream_name in wanted else d for d in defs]


def _load(directory: Path, *, env: str, replicas: int) -> list[Definition]:
    check_token("env", env)
    if replicas not in (1, 3, 5):
        raise MavjetError(f"replicas must be 1, 3 or 5, not {replicas}")
    defs: list[Definition] = []
    for path in sorted(directory.glob("*.json")):
        try:
            raw = json.loads(path.read_text())
            kind = raw["kind"]
            if kind == "stream":
                cfg = _stream_config(raw, env, replicas)
                defs.append(Definition(kind=kind, name=raw["name"], stream_name=raw["name"], config=cfg))
            elif kind == "kv":
                bucket = raw["bucket"]
                cfg = jsapi.StreamConfig(
                    name=f"KV_{bucket}",
                    description=raw.get("description"),
                    subjects=[f"$KV.{bucket}.>"],
                    storage=jsapi.StorageType(raw.get("storage", "file")),
                    max_msgs_per_subject=int(raw.get("history", 1)),
                    max_msg_size=parse_size_bytes(raw.get("max_value_size", -1)),
                    max_age=parse_duration_s(raw["max_age"]) if "max_age" in raw else None,
                    allow_direct=bool(raw.get("allow_direct", True)),
                    allow_rollup_hdrs=True,
                    discard=jsapi.DiscardPolicy.NEW,
                    duplicate_window=120.0,
                    num_replicas=replicas,
                )
                defs.append(Definition(kind=kind, name=bucket, stream_name=f"KV_{bucket}", config=cfg))
            elif kind == "object_store":
                bucket = raw["bucket"]
                cfg = jsapi.StreamConfig(
                    name=f"OBJ_{bucket}",
                    description=raw.get("description"),
                    subjects=[f"$O.{bucket}.C.>", f"$O.{bucket}.M.>"],
                    storage=jsapi.StorageType(raw.get("storage", "file")),
                    allow_rollup_hdrs=True,
                    allow_direct=True,
                    discard=jsapi.DiscardPolicy.NEW,
                    duplicate_window=120.0,
                    num_replicas=replicas,
                )
                defs.append(
                    Definition(
                        kind=kind, name=bucket, stream_name=f"OBJ_{bucket}", config=cfg,
                        chunk_size_bytes=parse_size_bytes(raw.get("chunk_size", "128KB")),
                    )
                )
            else:
                raise MavjetError(f"unknown kind {kind!r}")
        except (KeyError, ValueError, json.JSONDecodeError, MavjetError) as exc:
            raise MavjetError(f"definition {path.name}: {exc}") from exc
    if not defs:
        raise MavjetError(f"no definitions found in {directory}")
    return defs


def _norm(name: str, value: Any) -> Any:
    if name in ("max_age", "duplicate_window"):
        return round(float(value or 0.0), 3)
    if name in ("max_bytes", "max_msg_size", "max_msgs_per_subject", "max_consumers") and value in (None, 0):
        return -1
    if name in ("allow_rollup_hdrs", "allow_direct"):
        return bool(value)
    if name == "description":
        return value or None
    if name == "retention" and value is None:
        return "limits"
    if name == "storage" and value is None:
        return "file"
    if name == "num_replicas":
        return int(value or 1)
    if name == "subjects":
        return sorted(value or [])
    if hasattr(value, "value"):
        return value.value
    return value


def plan_stream(resource: str, live: jsapi.StreamConfig | None, wanted: jsapi.StreamConfig) -> Action:
    """Pure: what provisioning must do to make `live` match `wanted`."""
    if live is None:
        return Action(resource=resource, verb="create")
    for f in IMMUTABLE:
        a, b = _norm(f, getattr(live, f)), _norm(f, getattr(wanted, f))
        if a != b:
            raise ProvisionConflict(resource, f, a, b)
    changes: dict[str, tuple[Any, Any]] = {}
    for f in MANAGED:
        a, b = _norm(f, getattr(live, f)), _norm(f, getattr(wanted, f))
        if a != b:
            changes[f] = (a, b)
    return Action(resource=resource, verb="update" if changes else "unchanged", changes=changes)


class ProvisionTooLarge(MavjetError):
    """The server cannot reserve the file storage the definitions ask for."""

    def __init__(self, asked: dict[str, int], headroom: int) -> None:
        total = sum(asked.values())
        parts = " + ".join(f"{name} {human_bytes(n)}" for name, n in asked.items())
        fits = [name for name in ("medium", "small") if _preset_total(name, asked) <= headroom]
        hint = f"use --size {fits[0]} " if fits else ""
        super().__init__(
            f"asked to reserve {human_bytes(total)} of file storage ({parts}) but the server allows "
            f"{human_bytes(headroom)} more: {hint}or --max-bytes NAME=SIZE, or raise jetstream.max_file_store "
            "in the nats-server config (deploy/nats/)"
        )
        self.asked = asked
        self.headroom = headroom


def _preset_total(size: str, asked: dict[str, int]) -> int:
    preset = SIZES[size]
    return sum(preset.get(name, n) for name, n in asked.items())


def _file_bytes(cfg: jsapi.StreamConfig | None) -> int:
    if cfg is None or _norm("storage", cfg.storage) != "file" or not cfg.max_bytes or cfg.max_bytes < 0:
        return 0
    return int(cfg.max_bytes)


async def provision(js: JetStreamContext, defs: Sequence[Definition], *, dry_run: bool = False) -> list[Action]:
    """Create missing resources and update drifted ones, all or nothing.

    Plans everything first (raises ProvisionConflict before changing anything),
    then checks the server can reserve the extra file storage (raises
    ProvisionTooLarge with the numbers; a dry run checks too), then applies.
    If applying fails midway, what this run created is deleted and what it
    updated is put back, so the server is left as it was.
    """
    plans: list[tuple[Definition, Action, jsapi.StreamConfig | None]] = []
    for d in defs:
        label = f"{d.kind} {d.name}"
        try:
            live: jsapi.StreamConfig | None = (await js.stream_info(d.stream_name)).config
        except NotFoundError:
            live = None
        plans.append((d, plan_stream(label, live, d.config), live))
    # A stream with unlimited max_bytes (-1) reserves nothing; an update reserves only its growth.
    asked = {d.stream_name: _file_bytes(d.config) - _file_bytes(live) for d, a, live in plans if a.verb != "unchanged"}
    asked = {name: n for name, n in asked.items() if n > 0}
    if asked and not await reservable(js, sum(asked.values())):
        raise ProvisionTooLarge(asked, await headroom_bytes(js, sum(asked.values())))
    actions = [a for _, a, _ in plans]
    if dry_run:
        return actions
    done: list[tuple[Definition, Action, jsapi.StreamConfig | None]] = []
    for d, action, live in plans:
        if action.verb == "unchanged":
            continue
        try:
            if action.verb == "create":
                await add_stream_retrying(js, d.config)
            else:
                await js.update_stream(d.config)
        except Exception as exc:
            undone = await _undo(js, done)
            text = str(exc)
            why = ("the server has less JetStream storage than max_bytes reserves (mavjet provision --size small, "
                   "or raise jetstream.max_file_store: deploy/nats/)") if "insufficient storage" in text else text
            raise MavjetError(f"{action.resource}: {action.verb} failed: {why}; {undone}") from exc
        done.append((d, action, live))
    return actions


async def _undo(js: JetStreamContext, done: list[tuple[Definition, Action, jsapi.StreamConfig | None]]) -> str:
    """Put back what this run changed, newest first; says what it could not."""
    failed = []
    for d, action, live in reversed(done):
        try:
            if action.verb == "create":
                await js.delete_stream(d.stream_name)
            elif live is not None:
                await js.update_stream(live)
        except Exception as exc:  # keep undoing the rest; report every one left behind
            failed.append(f"{d.stream_name} ({type(exc).__name__}: {exc})")
    if failed:
        return "could not undo: " + ", ".join(failed)
    return "nothing was changed" if not done else f"undid {len(done)} earlier change(s); nothing was changed"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mavjet provision",
        description="Create or update the twin's streams (TWIN_STATE, TWIN_EVENTS, TWIN_CMD, TWIN_LOGS, ...), "
        "TWIN_SHADOW, TWIN_LEASES, TWIN_ROLLOUTS and TWIN_BLOBS from the definitions in deploy/jetstream/. Safe to run again.",
    )
    natsconn.add_nats_arguments(p)
    p.add_argument("--replicas", type=int, default=1, help="1 on a single server, 3 on a cluster (default: 1)")
    p.add_argument("--dry-run", action="store_true", help="print what would change, change nothing")
    p.add_argument("--definitions", type=Path, default=DEFINITIONS_DIR, help="directory of JSON definitions")
    p.add_argument("--size", choices=list(SIZES),
                   help="scale the storage reservations: small (events 1 GiB, state 256 MiB, blobs 1 GiB, logs "
                        "512 MiB: a laptop or companion), medium (10 GiB, 2 GiB, 10 GiB, 5 GiB), large (the "
                        "definitions: 100 GB, 10 GB, blobs and logs unbounded); "
                        "default: the definitions")
    p.add_argument("--max-bytes", action="append", default=[], metavar="NAME=SIZE",
                   help="reserve SIZE for one resource, e.g. TWIN_EVENTS=20GB (repeatable; after --size)")
    return p


def _max_bytes(items: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        name, sep, size = item.partition("=")
        try:
            if not sep:
                raise ValueError("expected NAME=SIZE")
            out[name.strip()] = parse_size_bytes(size)
        except ValueError as exc:
            raise MavjetError(f"--max-bytes {item!r}: {exc}") from None
    return out


async def run(args: argparse.Namespace) -> int:
    defs = load_definitions(args.definitions, env=args.env, replicas=args.replicas, size=args.size,
                            max_bytes=_max_bytes(args.max_bytes))
    nc = await connect(args, name="mavjet-provision")
    try:
        actions = await provision(nc.jetstream(), defs, dry_run=args.dry_run)
    finally:
        await nc.close()
    prefix = "would " if args.dry_run else ""
    for a in actions:
        print(prefix + a.describe())
    return 0


def main(argv: list[str]) -> int:
    return run_cli(build_parser(), run, argv)
