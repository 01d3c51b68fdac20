"""`mavjet mission put FILE.plan [--name missions/x.plan]`: store a mission plan in TWIN_BLOBS.

The plan is stored once by content, as `sha256/<hex>`, and the name given
is a link to it (gateway/stores/blobs.py); the gateway reads it by that name. The
plan is parsed here first (mavjet.drivers.mavlink.plan), so a broken file is
refused with the field at fault before any vehicle is asked to fly it; the
digest printed is the one the gateway's `mission_uploaded` event will carry
once a vehicle has the mission. Items in a terrain-relative frame are not
refused here: only the vehicle knows whether it holds terrain data, so the
gateway asks it (TERRAIN_CHECK) at upload and refuses the plan there if not;
`put` says so. `mavjet mission ls` lists stored plans.
Then: `mavjet cmd VID mission_upload --param object=missions/x.plan --wait`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mavjet.contract import natsconn
from mavjet.contract.commands import OBJECT_NAME
from mavjet.drivers.mavlink.plan import PlanError, parse_plan
from mavjet.gateway.stores.blobs import put_blob
from mavjet.ops import console
from mavjet.ops.runner import run_cli

BLOBS = "TWIN_BLOBS"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mavjet mission", description="Store mission plans in TWIN_BLOBS.")
    sub = p.add_subparsers(dest="action", required=True)
    put = sub.add_parser("put", help="validate a QGroundControl .plan and store it")
    put.add_argument("file", type=Path, help="a QGroundControl .plan file")
    put.add_argument("--name", help="object name (default: missions/<file name>)")
    put.add_argument("--json", action="store_true", help="machine-readable output")
    natsconn.add_nats_arguments(put)
    ls = sub.add_parser("ls", help="list stored objects under missions/")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    natsconn.add_nats_arguments(ls)
    return p


async def put(args: argparse.Namespace) -> int:
    try:
        data = args.file.read_bytes()
    except OSError as exc:
        print(f"mavjet mission: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
        return 2
    try:
        plan = parse_plan(data)
    except PlanError as exc:
        print(f"mavjet mission: {args.file}: {exc}", file=sys.stderr)
        return 2
    name = args.name or f"missions/{args.file.name}"
    if not OBJECT_NAME.match(name) or ".." in name:
        print(f"mavjet mission: {name!r} is not a valid object name (e.g. missions/survey.plan)", file=sys.stderr)
        return 2
    nc = await natsconn.connect_once(natsconn.options_from_args(args, name="mavjet-mission"))
    try:
        # Stored once by content (sha256/<hex>); `name` is a link to it (gateway/stores/blobs.py).
        stored = await put_blob(nc.jetstream(), data, alias=name)
    finally:
        await nc.close()
    doc = {
        "object": name, "bytes": len(data), "items": len(plan.mission), "fence_items": len(plan.fence),
        "rally_items": len(plan.rally), "digest": plan.mission_digest, "nuid": stored.sha256,
        "sha256": stored.sha256, "content": stored.name, "already_present": stored.already_present,
        "terrain_items": plan.terrain_items,
    }  # fmt: skip
    if args.json:
        print(json.dumps(doc))
    else:
        print(f"stored {name} ({len(data)} bytes, {len(plan.mission)} mission items incl. home, "
              f"digest {plan.mission_digest[:16]})")
    if plan.terrain_items:
        print(f"note: {plan.terrain_items} item(s) in a terrain-relative frame: the vehicle decides; the gateway "
              "uploads the plan only if the vehicle reports terrain data for each (TERRAIN_REPORT)", file=sys.stderr)
    return 0


async def ls(args: argparse.Namespace) -> int:
    from nats.js.errors import NotFoundError

    nc = await natsconn.connect_once(natsconn.options_from_args(args, name="mavjet-mission"))
    try:
        store = await nc.jetstream().object_store(BLOBS)
        try:
            infos = await store.list()
        except NotFoundError:
            infos = []
    finally:
        await nc.close()
    rows = sorted((i.name, i.size or 0, i.mtime or "") for i in infos if i.name.startswith("missions/") and not i.deleted)
    if args.json:
        print(json.dumps([{"object": n, "bytes": s, "mtime": str(m)} for n, s, m in rows]))
    elif console.is_tty():
        console.print_table(["OBJECT", "SIZE", "STORED AT"], [(n, f"{s} B", str(m)) for n, s, m in rows],
                            right=["SIZE"])
    else:
        for n, s, m in rows:
            print(f"{n:<40} {s:>9} B  {m}")
    return 0


async def run(args: argparse.Namespace) -> int:
    return await (put(args) if args.action == "put" else ls(args))


def main(argv: list[str]) -> int:
    return run_cli(build_parser(), run, argv)
