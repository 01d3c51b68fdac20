"""`mavjet rollout`: apply a shadow change to many vehicles in waves, safely (docs/rollout.md).

    mavjet rollout start (--vehicles VID,VID | --select type=copter,site=north) params.RTL_ALT=2000 ...
                         [--canary 1] [--waves 10%,50%,100%] [--max-failures 2|5%]
                         [--disarm-timeout 5m] [--converge-timeout 2m] [--id NAME] [--detach]
    mavjet rollout status [ID] [--json]     (every rollout, or one with its per-vehicle table)
    mavjet rollout resume ID [--max-failures N]   (after a killed operator, or a halt)
    mavjet rollout abort ID [--rollback]
    mavjet rollout rollback ID              (each written vehicle's previous desired, where still the rollout's)
    mavjet rollout tag VID site=north [type=survey] [site=]   (operator tags a selector matches, beside meta)
    mavjet rollout tags                     (every vehicle's tag view)

The rules are in ops/rollout_plan.py (pure), the stores in ops/rollout_store.py,
the loop in ops/rollout_run.py. Exit status: 0 done (or the command did what it
said), 1 halted, aborted or rolled back, 2 bad input or an unreachable server.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from mavjet.contract import natsconn
from mavjet.contract.events import EventType
from mavjet.contract.subjects import check_token
from mavjet.ops.console import is_tty, plain_table, print_table
from mavjet.ops.resolve import connect
from mavjet.ops.rollout_plan import (
    Rollout,
    RolloutError,
    RolloutStatus,
    Settings,
    Step,
    new_rollout,
    resume_halted,
    summary,
)
from mavjet.ops.rollout_run import ProgressFn, abort, change_status, drive, rollback
from mavjet.ops.rollout_store import RolloutStore
from mavjet.ops.rollout_targets import (
    parse_selector,
    parse_threshold,
    parse_waves,
    plan_waves,
    select,
    tag_view,
)
from mavjet.ops.runner import duration, run_cli
from mavjet.ops.shadow import parse_value

EXIT_NOT_DONE = 1


def parse_change(assignments: list[str]) -> dict[str, Any]:
    """`params.RTL_ALT=2000 rates.position=5 mode=` -> {path: value}; `FIELD=` removes the field."""
    out: dict[str, Any] = {}
    for a in assignments:
        path, sep, raw = a.partition("=")
        path = path.strip()
        if not sep or not path or any(not p for p in path.split(".")):
            raise RolloutError(f"{a!r}: expected FIELD=VALUE, e.g. params.RTL_ALT=2000")
        out[path] = parse_value(raw) if raw.strip() else None
    return out


def new_id(now: dt.datetime) -> str:
    return f"r{now:%Y%m%dT%H%M%SZ}"


async def run(args: argparse.Namespace) -> int:
    if getattr(args, "id", None):
        check_token("rollout id", args.id)
    nc = await connect(args, name="mavjet-rollout")
    try:
        store = await RolloutStore.open(nc, args.env)
        return int(await ACTIONS[args.action](args, store))
    finally:
        await nc.close()


async def _start(args: argparse.Namespace, store: RolloutStore) -> int:
    change = parse_change(args.assignments)
    if bool(args.vehicles) == bool(args.select):
        raise RolloutError("give the targets: --vehicles VID,VID,... or --select KEY=VALUE,... (one of them)")
    if args.vehicles:
        targets = sorted({check_token("vid", v.strip()) for v in args.vehicles.split(",") if v.strip()})
        selector_text = args.vehicles
    else:
        selector = parse_selector(args.select)
        views = {vid: tag_view(meta, tags) for vid, (meta, tags) in (await store.tag_views()).items()}
        targets = select(views, selector)
        selector_text = args.select
        if not targets:
            raise RolloutError(f"no vehicle matches {args.select!r} (`mavjet rollout tags` shows what they carry)")
    waves = plan_waves(len(targets), canary=args.canary, fractions=parse_waves(args.waves))
    settings = Settings(disarm_timeout_s=args.disarm_timeout, converge_timeout_s=args.converge_timeout,
                        reject_attempts=args.reject_attempts, max_failures=parse_threshold(args.max_failures, len(targets)))
    now = dt.datetime.now(dt.UTC)
    r = new_rollout(rollout_id=args.id or new_id(now), env=args.env, change=change, targets=targets, waves=waves,
                    settings=settings, now_s=now.timestamp(), selector=selector_text)
    await store.create(r)
    await store.fleet_event(r, EventType.ROLLOUT_STARTED, "start", change=r.change, targets=len(targets),
                            waves=list(r.waves), max_failures=settings.max_failures, selector=selector_text)
    print(f"rollout {r.id}: {len(targets)} vehicles in {len(waves)} waves {list(waves)}, "
          f"max failures {settings.max_failures}", file=sys.stderr)
    if args.detach:
        print(r.id)
        return 0
    return await _drive(args, store, r.id)


async def _drive(args: argparse.Namespace, store: RolloutStore, rollout_id: str) -> int:
    with progress_view(quiet=args.json) as show:
        r = await drive(store, rollout_id, tick_s=args.tick, progress=show)
    _result(args, r, only_problems=True)
    return 0 if r.status is RolloutStatus.DONE else EXIT_NOT_DONE


async def _resume(args: argparse.Namespace, store: RolloutStore) -> int:
    r, _ = await store.load(args.id)
    if r.status is RolloutStatus.HALTED:
        limit = None if args.max_failures is None else parse_threshold(args.max_failures, len(r.vehicles))
        if limit is None or limit <= r.failures():
            _result(args, r, only_problems=True)
            print(f"mavjet rollout: {r.id} is halted ({r.reason}); `resume {r.id} --max-failures N` with N above "
                  f"{r.failures()} goes on, `rollback {r.id}` undoes it", file=sys.stderr)
            return EXIT_NOT_DONE
        await change_status(store, r.id, lambda cur: resume_halted(cur, limit, time.time()))
    elif r.status is not RolloutStatus.RUNNING:
        _result(args, r, only_problems=True)
        return 0 if r.status is RolloutStatus.DONE else EXIT_NOT_DONE
    return await _drive(args, store, r.id)


async def _status(args: argparse.Namespace, store: RolloutStore) -> int:
    if args.id:
        r, _ = await store.load(args.id)
        _result(args, r, only_problems=False)
        return 0
    rollouts = await store.list()
    if args.json:
        print(json.dumps([_brief(r) for r in rollouts], indent=2, sort_keys=True))
        return 0
    rows = [[r.id, r.status.value, f"{s.wave}/{s.waves}", str(s.total), str(s.converged), str(s.failed),
             _when(r.created_s), r.reason] for r in rollouts for s in [summary(r)]]
    _table(["ID", "STATUS", "WAVE", "VEHICLES", "CONVERGED", "FAILED", "CREATED", "REASON"], rows,
           right=["VEHICLES", "CONVERGED", "FAILED"])
    return 0


async def _abort(args: argparse.Namespace, store: RolloutStore) -> int:
    r = await (rollback(store, args.id, args.reason) if args.rollback else abort(store, args.id, args.reason))
    _result(args, r, only_problems=True)
    return 0


async def _rollback(args: argparse.Namespace, store: RolloutStore) -> int:
    r = await rollback(store, args.id, args.reason)
    _result(args, r, only_problems=False)
    return 0


async def _tag(args: argparse.Namespace, store: RolloutStore) -> int:
    check_token("vid", args.vid)
    rev, tags = await store.get_tags(args.vid)
    for pair in args.pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise RolloutError(f"{pair!r}: expected KEY=VALUE (KEY= removes it), e.g. site=north")
        parse_selector(f"{key.strip()}=x")  # the same key rule as a selector's
        if value.strip():
            tags[key.strip()] = value.strip()
        else:
            tags.pop(key.strip(), None)
    await store.set_tags(args.vid, {str(k): str(v) for k, v in tags.items()}, rev)
    print(json.dumps(tags, sort_keys=True))
    return 0


async def _tags(args: argparse.Namespace, store: RolloutStore) -> int:
    stored = dict(sorted((await store.tag_views()).items()))
    views = {vid: tag_view(meta, tags) for vid, (meta, tags) in stored.items()}
    if args.json:
        print(json.dumps(views, indent=2, sort_keys=True))
        return 0
    keys = ("type", "flavour", "firmware")
    rows = [[vid, *(str((meta or {}).get(k, "")) for k in keys), ",".join(f"{k}={t}" for k, t in sorted(tags.items()))]
            for vid, (meta, tags) in stored.items()]
    _table(["VID", "TYPE", "FLAVOUR", "FIRMWARE", "TAGS"], rows)
    return 0


ACTIONS = {"start": _start, "resume": _resume, "status": _status, "abort": _abort, "rollback": _rollback,
           "tag": _tag, "tags": _tags}


# -- output ----------------------------------------------------------------------------------


def _when(ts_s: float) -> str:
    return dt.datetime.fromtimestamp(ts_s, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ") if ts_s else ""


def _brief(r: Rollout) -> dict[str, Any]:
    s = summary(r)
    return {"id": r.id, "status": r.status.value, "wave": s.wave, "waves": s.waves, "vehicles": s.total,
            "converged": s.converged, "failed": s.failed, "failures": s.by_failure, "reason": r.reason,
            "created": _when(r.created_s), "selector": r.selector, "change": r.change}


def _table(headers: list[str], rows: list[list[str]], right: tuple[str, ...] | list[str] = ()) -> None:
    if is_tty():
        print_table(headers, rows, right=right)
    else:
        print(plain_table(headers, rows))


def _result(args: argparse.Namespace, r: Rollout, *, only_problems: bool) -> None:
    """The per-vehicle table (all of it, or the vehicles that did not converge) and one summary line."""
    if args.json:
        print(json.dumps(_brief(r) | {"vehicles": {vid: v.to_json() for vid, v in r.vehicles.items()}},
                         indent=2, sort_keys=True))
        return
    vs = [v for v in r.vehicles.values() if not only_problems or v.step not in (Step.CONVERGED, Step.PENDING)]
    if vs:
        _table(["VID", "WAVE", "STEP", "FAILURE", "REVISION", "DETAIL"],
               [[v.vid, str(v.wave + 1), v.step.value, v.failure.value if v.failure else "",
                 str(v.revision or ""), v.detail] for v in vs], right=["WAVE", "REVISION"])
    s = summary(r)
    fails = ", ".join(f"{k} {n}" for k, n in sorted(s.by_failure.items()))
    print(f"rollout {r.id}: {r.status.value}, wave {s.wave}/{s.waves}, {s.converged}/{s.total} converged, "
          f"{s.failed} failed" + (f" ({fails})" if fails else "") + (f": {r.reason}" if r.reason else ""))


@contextmanager
def progress_view(*, quiet: bool) -> Iterator[ProgressFn]:
    """A rich bar on a terminal's stderr; elsewhere one plain line whenever the counts change."""
    last: list[tuple[int, int, int, str]] = []

    def line(r: Rollout) -> None:
        s = summary(r)
        key = (s.finished, s.failed, s.wave, r.status.value)
        if quiet or (last and last[-1] == key):
            return
        last.append(key)
        print(f"rollout {r.id}: wave {s.wave}/{s.waves}, {s.finished}/{s.total} done, {s.failed} failed, "
              f"{r.status.value}", file=sys.stderr, flush=True)

    if quiet or not is_tty(sys.stderr):
        yield line
        return
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                   TimeElapsedColumn(), console=Console(file=sys.stderr), transient=True)
    task = bar.add_task("rollout", total=None, info="")
    with bar:
        def show(r: Rollout) -> None:
            s = summary(r)
            bar.update(task, completed=s.finished, total=s.total, description=f"{r.id} wave {s.wave}/{s.waves}",
                       info=f"{s.failed} failed")
        yield show


# -- parser ----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mavjet rollout", description="Apply a shadow change to many vehicles in waves: a canary, then "
        "percentages; each vehicle only when disarmed; a wave only after the previous converged; halts at a "
        "failure threshold; resumable and undoable.", epilog="docs/rollout.md has the rules and examples.")
    sub = p.add_subparsers(dest="action", required=True)

    def common(sp: argparse.ArgumentParser, *, json_help: str = "JSON for scripts") -> None:
        natsconn.add_nats_arguments(sp)
        sp.add_argument("--json", action="store_true", help=json_help)

    def driving(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--tick", type=duration, default=1.0, help="how often the fleet is looked at (default: 1s)")

    s = sub.add_parser("start", help="start a rollout and drive it (--detach: only store it; `resume` drives it)")
    s.add_argument("assignments", nargs="+", metavar="FIELD=VALUE",
                   help="the change, as `mavjet shadow set` takes it: params.RTL_ALT=2000 rates.position=5; FIELD= "
                        "removes it")
    s.add_argument("--vehicles", help="the targets by id: VID-001,VID-002,...")
    s.add_argument("--select", help="the targets by tags (meta and `rollout tag`): type=copter,site=north")
    s.add_argument("--canary", type=int, default=1, help="vehicles in the first wave (default: 1; 0: none)")
    s.add_argument("--waves", default="10%,50%,100%",
                   help="then waves up to these shares of the targets (default: 10%%,50%%,100%%)")
    s.add_argument("--max-failures", default="0",
                   help="halt when failures exceed this: a count or a share of the targets, e.g. 2 or 5%% (default: 0)")
    s.add_argument("--disarm-timeout", type=duration, default=300.0,
                   help="how long a vehicle may stay armed (or offline) before it counts as failed (default: 5m)")
    s.add_argument("--converge-timeout", type=duration, default=120.0,
                   help="how long after the write the changed fields may take to converge (default: 2m)")
    s.add_argument("--reject-attempts", type=int, default=3,
                   help="a changed field the gateway failed to apply this many times counts as refused (default: 3)")
    s.add_argument("--id", help="the rollout's name (default: r<UTC time>)")
    s.add_argument("--detach", action="store_true", help="store the rollout and print its id; do not drive it")
    driving(s)
    common(s, json_help="print the final result as JSON (progress stays on stderr, plain)")
    r = sub.add_parser("resume", help="drive a stored rollout on (after a killed operator process, or a halt)")
    r.add_argument("id", help="the rollout id")
    r.add_argument("--max-failures", help="a halted rollout: the new threshold (count or share) that lets it go on")
    driving(r)
    common(r)
    st = sub.add_parser("status", help="every rollout, or one with its per-vehicle table")
    st.add_argument("id", nargs="?", help="a rollout id")
    common(st)
    a = sub.add_parser("abort", help="stop a rollout: no more writes (a driver stops at its next pass)")
    a.add_argument("id", help="the rollout id")
    a.add_argument("--rollback", action="store_true", help="and restore each written vehicle's previous desired")
    a.add_argument("--reason", default="aborted by an operator", help="recorded and published with the abort")
    common(a)
    b = sub.add_parser("rollback", help="stop it and restore each written vehicle's previous desired")
    b.add_argument("id", help="the rollout id")
    b.add_argument("--reason", default="rolled back by an operator", help="recorded and published")
    common(b)
    t = sub.add_parser("tag", help="set a vehicle's operator tags (KEY=VALUE; KEY= removes)")
    t.add_argument("vid", help="vehicle id")
    t.add_argument("pairs", nargs="+", metavar="KEY=VALUE", help="tags to set, e.g. site=north type=survey; KEY= removes one")
    common(t)
    ts = sub.add_parser("tags", help="what selectors match: each vehicle's meta and tags")
    common(ts)
    return p


def main(argv: list[str]) -> int:
    return run_cli(build_parser(), run, argv)


if __name__ == "__main__":  # `python -m mavjet.ops.rollout`: what the tests kill
    sys.exit(main(sys.argv[1:]))
