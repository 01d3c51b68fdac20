"""`mavjet mission put FILE.plan|FILE.waypoints [--name missions/x.plan]`: check a mission plan, store it in TWIN_BLOBS.

The plan is stored once by content, as `sha256/<hex>`, and the name given
is a link to it (gateway/stores/blobs.py); the gateway reads it by that name. The
plan is parsed here first (mavjet.drivers.mavlink.plan), so a broken file is
refused with the field at fault before any vehicle is asked to fly it; the
digest printed is the one the gateway's `mission_uploaded` event will carry
once a vehicle has the mission. Items in a terrain-relative frame are not
refused here: only the vehicle knows whether it holds terrain data, so the
gateway asks it (TERRAIN_CHECK) at upload and refuses the plan there if not;
`put` says so. A Mission Planner `.waypoints` file (QGC WPL 110) is read as
well (mavjet.drivers.mavlink.waypoints) and stored as the `.plan` it becomes.
Then the plan is checked as QGroundControl checks it
(mavjet.drivers.mavlink.plancheck, docs/missions.md): a refusal stores
nothing (exit 2), warnings are printed and the plan is stored; the gateway
runs the same checks again at `mission_upload`. `mavjet mission ls` lists stored plans.
Then: `mavjet cmd VID mission_upload --param object=missions/x.plan --wait`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path

from mavjet.contract import natsconn
from mavjet.contract.commands import OBJECT_NAME, CommandName
from mavjet.contract.subjects import BLOBS_BUCKET, CMD_STREAM, STATE_STREAM, check_token
from mavjet.contract.units import parse_duration_s
from mavjet.drivers.mavlink.plan import Plan, PlanError, parse_plan
from mavjet.drivers.mavlink.plancheck import (
    Label,
    PlanLimits,
    check_plan,
    plan_label,
    refusals,
    warnings,
)
from mavjet.drivers.mavlink.waypoints import is_waypoints, parse_waypoints, waypoints_label
from mavjet.gateway.stores.blobs import get_blob, put_blob
from mavjet.ops import console, resolve
from mavjet.ops.client import CommandClient, ResultTimeout
from mavjet.ops.resolve import connect, require_env
from mavjet.ops.runner import run_cli

BLOBS = "TWIN_BLOBS"


def _limit(most: float) -> Callable[[str], float]:
    """An argparse type: a number in (0, most]."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (0 < value <= most):
            raise argparse.ArgumentTypeError(f"{text} outside (0, {most:g}]")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mavjet mission", description="Store mission plans in TWIN_BLOBS.")
    sub = p.add_subparsers(dest="action", required=True)
    put = sub.add_parser("put", help="check a QGroundControl .plan (or Mission Planner .waypoints) and store it")
    put.add_argument("file", type=Path, help="a QGroundControl .plan or a Mission Planner .waypoints (QGC WPL 110) file")
    put.add_argument("--name", help="object name (default: missions/<file name>, .waypoints stored as .plan)")
    limits = PlanLimits()
    # The gateway checks again at upload with the defaults: a refusal limit can only be lowered here.
    put.add_argument("--ceiling-m", type=_limit(limits.ceiling_m), default=limits.ceiling_m, metavar="M",
                     help=f"refuse items higher above home (default and most {limits.ceiling_m:g})")
    put.add_argument("--max-speed-m-s", type=_limit(limits.max_speed_m_s), default=limits.max_speed_m_s,
                     metavar="M_S", help=f"refuse DO_CHANGE_SPEED above this (default and most {limits.max_speed_m_s:g})")
    put.add_argument("--max-leg-m", type=_limit(math.inf), default=limits.max_leg_m, metavar="M",
                     help=f"warn about a waypoint further from the previous one or home (default {limits.max_leg_m:g})")
    put.add_argument("--json", action="store_true", help="machine-readable output")
    natsconn.add_nats_arguments(put)
    get = sub.add_parser("get", help="read back what a vehicle holds (mission, fence, rally) and write it as a .plan",
                         description="Ask the vehicle's gateway to download the vehicle's mission, fence and rally "
                         "points (command mission_download), which it stores in TWIN_BLOBS as readback/<VID>/<UTC>.plan, "
                         "then write that file here.")
    get.add_argument("vid", help="vehicle id, e.g. VID-001")
    get.add_argument("-o", "--out", type=Path, help="where to write the .plan (default: <VID>.plan)")
    get.add_argument("--timeout", type=parse_duration_s, default=60.0, metavar="DURATION",
                     help="how long to wait for the vehicle's answer (default 60s)")
    get.add_argument("--json", action="store_true", help="machine-readable output")
    natsconn.add_nats_arguments(get)
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
    label: Label = plan_label
    try:
        plan: Plan
        if is_waypoints(data):
            doc_in, plan = parse_waypoints(data)
            data = (json.dumps(doc_in, indent=2) + "\n").encode()  # stored as the .plan it becomes
            label = waypoints_label
        else:
            plan = parse_plan(data)
    except PlanError as exc:
        print(f"mavjet mission: {args.file}: {exc}", file=sys.stderr)
        return 2
    limits = PlanLimits(ceiling_m=args.ceiling_m, max_speed_m_s=args.max_speed_m_s, max_leg_m=args.max_leg_m)
    findings = check_plan(plan, limits, label=label)
    refused, warned = refusals(findings), warnings(findings)
    for f in refused:
        print(f"mavjet mission: {args.file}: refused: {f}", file=sys.stderr)
    if refused:
        for w in warned:
            print(f"warning: {w}", file=sys.stderr)
        print(f"mavjet mission: {args.file}: not stored ({len(refused)} refusal{'s' if len(refused) > 1 else ''}; "
              "docs/missions.md, Plan checks)", file=sys.stderr)
        return 2
    stored_as = f"{args.file.stem}.plan" if label is waypoints_label else args.file.name
    name = args.name or f"missions/{stored_as}"
    if not OBJECT_NAME.match(name) or ".." in name:
        print(f"mavjet mission: {name!r} is not a valid object name (e.g. missions/survey.plan)", file=sys.stderr)
        return 2
    nc = await connect(args, name="mavjet-mission")
    try:
        await require_env(nc.jetstream(), args.env, (BLOBS_BUCKET,))
        # Stored once by content (sha256/<hex>); `name` is a link to it (gateway/stores/blobs.py).
        stored = await put_blob(nc.jetstream(), data, alias=name)
    finally:
        await nc.close()
    doc = {
        "object": name, "bytes": len(data), "items": len(plan.mission), "fence_items": len(plan.fence),
        "rally_items": len(plan.rally), "digest": plan.mission_digest, "nuid": stored.sha256,
        "sha256": stored.sha256, "content": stored.name, "already_present": stored.already_present,
        "terrain_items": plan.terrain_items, "warnings": [str(w) for w in warned],
    }  # fmt: skip
    if args.json:
        print(json.dumps(doc))
    else:
        converted = ", converted from Mission Planner QGC WPL 110" if label is waypoints_label else ""
        print(f"stored {name} ({len(data)} bytes, {len(plan.mission)} mission items incl. home, "
              f"mission digest {plan.mission_digest[:16]}{converted}; file sha256 {stored.sha256[:16]})")
        # Two hashes, two questions: the file's sha256 names the stored bytes (`mavjet blobs ls`); the mission
        # digest is of the items alone, the one the vehicle's mission upload event carries.
    for w in warned:
        print(f"warning: {w}", file=sys.stderr)
    if plan.terrain_items:
        print(f"note: {plan.terrain_items} item(s) in a terrain-relative frame: the vehicle decides; the gateway "
              "uploads the plan only if the vehicle reports terrain data for each (TERRAIN_REPORT)", file=sys.stderr)
    return 0


async def ls(args: argparse.Namespace) -> int:
    from nats.js.errors import NotFoundError

    nc = await connect(args, name="mavjet-mission")
    try:
        await require_env(nc.jetstream(), args.env, (BLOBS_BUCKET,))
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


async def get(args: argparse.Namespace) -> int:
    check_token("vid", args.vid)
    nc = await connect(args, name="mavjet-mission")
    try:
        v = await resolve.vehicle(nc, args.env, args.vid, needs=(CMD_STREAM, STATE_STREAM, BLOBS_BUCKET))
        resolve.require_served(v, why="reading its mission back needs the gateway that serves it")
        async with CommandClient(nc, args.env, issuer="mavjet-mission") as client:
            try:
                res = await client.call(args.vid, CommandName.MISSION_DOWNLOAD, {}, timeout_s=args.timeout,
                                        deadline_s=args.timeout)
            except ResultTimeout as exc:
                print(f"mavjet mission: {exc} (is a gateway serving {args.vid}?)", file=sys.stderr)
                return 4
            if not res.accepted:
                print(f"mavjet mission: {args.vid} mission_download {res.result}: {res.detail}", file=sys.stderr)
                return 1
            obj = str(res.data.get("object"))
            out: Path = args.out or Path(f"{args.vid}.plan")
            await get_blob(nc.jetstream(), obj, out)
    finally:
        await nc.close()
    counts = {k: res.data.get(k) for k in ("count", "fence_count", "rally_count")}
    if args.json:
        print(json.dumps({"vid": args.vid, "object": obj, "file": str(out), **counts}))
    else:
        print(f"{out}: {counts['count']} mission items, {counts['fence_count']} fence, "
              f"{counts['rally_count']} rally (stored as {obj})")
    return 0


async def run(args: argparse.Namespace) -> int:
    if args.action == "get":
        return await get(args)
    return await (put(args) if args.action == "put" else ls(args))


def main(argv: list[str]) -> int:
    return run_cli(build_parser(), run, argv)
