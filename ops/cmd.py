"""`mavjet cmd VID NAME [--param k=v ...] [--deadline 30s] [--wait]`: command a vehicle through TWIN_CMD.

Parameters are checked against the catalogue before anything is published
(the gateway checks again: it trusts no publisher). With `--wait` the command
prints its `cmd_result` and the round trip, and the exit status says how it
ended: 0 accepted, 1 not accepted, 2 bad usage (or a vehicle no gateway has
registered or whose gateway is gone, unless `--force`; an unprovisioned env), 3 NATS unreachable, 4 no result within
`--timeout`, 5 the stream dropped the publish as a duplicate of a command
already queued with the same id for the vehicle.

`--wait --timeout T` gives the command the deadline issued+T (unless
`--deadline` is given): a command the CLI stopped waiting for is never
executed later.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from mavjet.contract import natsconn
from mavjet.contract.commands import CATALOGUE, CommandInvalid, check_command_id, parse_cli_params
from mavjet.contract.errors import MavjetError
from mavjet.contract.natsconn import NatsUnavailable
from mavjet.contract.subjects import CMD_STREAM, STATE_STREAM, check_token
from mavjet.contract.units import parse_duration_s
from mavjet.ops import resolve
from mavjet.ops.client import CommandClient, DuplicateCommand, ResultTimeout, new_command_id
from mavjet.ops.console import is_tty, print_table
from mavjet.ops.resolve import connect
from mavjet.ops.runner import run_cli

DEFAULT_DEADLINE_S = 30.0  # the gateway's commands.default_deadline_s, made explicit for a vehicle nobody serves
EXIT_ACCEPTED, EXIT_NOT_ACCEPTED, EXIT_USAGE, EXIT_NATS, EXIT_TIMEOUT, EXIT_DUPLICATE = 0, 1, 2, 3, 4, 5


def _catalogue_rows() -> list[list[str]]:
    """[name, parameters, summary] per command; a `?` marks an optional parameter."""
    return [[str(spec.name),
             " ".join(f"{p.name}=<{p.kind.__name__}{', ' + p.unit if p.unit else ''}>" + ("" if p.required else "?")
                      for p in spec.params),
             spec.summary] for spec in CATALOGUE.values()]


def _catalogue_text() -> str:
    return "\n".join(["commands:", *(f"  {n:<15} {params:<45} {summary}" for n, params, summary in _catalogue_rows())])


def catalogue_json() -> list[dict[str, object]]:
    return [{"name": str(spec.name), "summary": spec.summary,
             "params": [{"name": p.name, "type": p.kind.__name__, "required": p.required, "unit": p.unit or None,
                         "min": p.lo, "max": p.hi, "default": p.default} for p in spec.params]}
            for spec in CATALOGUE.values()]


class _ListAction(argparse.Action):
    """`--list [text|json]`: print the command catalogue and exit, like --help (no VID, no server)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[Any] | None, option_string: str | None = None) -> None:
        if values == "json":
            print(json.dumps(catalogue_json(), indent=2, default=str))
        elif is_tty():
            print_table(["NAME", "PARAMETERS", "WHAT IT DOES"], _catalogue_rows())
        else:
            print(_catalogue_text())
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mavjet cmd",
        description="Send a command to a vehicle through TWIN_CMD (and with --wait, print its result).",
        epilog="Example: mavjet cmd VID-001 takeoff --param alt_m=20 --deadline 30s --wait\n\n" + _catalogue_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--list", action=_ListAction, nargs="?", const="text", choices=("text", "json"),
                   help="print the command catalogue (`--list json` for scripts) and exit")
    p.add_argument("vid", help="vehicle id, e.g. VID-001")
    p.add_argument("name", choices=list(CATALOGUE), metavar="NAME", help="command name (see the list below)")
    p.add_argument("--param", "-p", action="append", default=[], metavar="KEY=VALUE", help="a parameter (repeatable)")
    p.add_argument("--deadline", help="do not execute after this long from now (e.g. 30s, 2m); default: with "
                   "--wait, the --timeout; else the gateway's commands.default_deadline_s (30 s) from now")
    p.add_argument("--wait", action="store_true", help="wait for the cmd_result and exit 0 only if accepted")
    p.add_argument("--timeout", default="60s",
                   help="how long --wait waits; also the command's deadline unless --deadline (default: %(default)s)")
    p.add_argument("--force", action="store_true",
                   help="queue the command even if no gateway has registered the vehicle, or its gateway is gone "
                        "(it waits until its deadline)")
    p.add_argument("--id", dest="cmd_id", help="command id (default: a new UUID); reusing an id is de-duplicated")
    p.add_argument("--issuer", default="mavjet-cli", help="who issues the command (audit trail)")
    p.add_argument("--central", action="store_true",
                   help="at a central cluster over leaf hubs: the hubs' TWIN_CMD store the command, and its result "
                   "is read from the centre's sourced TWIN_EVENTS (docs/deploy.md, Central cluster over leaf hubs)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    natsconn.add_nats_arguments(p)
    return p


async def run(args: argparse.Namespace) -> int:
    try:
        check_token("vid", args.vid)
        params = parse_cli_params(args.name, args.param)
        if args.cmd_id is not None:
            check_command_id(args.cmd_id)
        deadline_s = None if args.deadline is None else parse_duration_s(args.deadline)
        timeout_s = parse_duration_s(args.timeout)
        if deadline_s is None and args.wait:
            deadline_s = timeout_s  # never leave behind a command this CLI stopped waiting for
    except (CommandInvalid, ValueError, MavjetError) as exc:
        print(f"mavjet cmd: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        nc = await connect(args, name="mavjet-cmd")
    except NatsUnavailable as exc:
        print(f"mavjet cmd: {exc}", file=sys.stderr)
        return EXIT_NATS
    try:
        try:
            # At a centre the commands' streams are the hubs', in their own domains: not looked for here.
            needs = (STATE_STREAM,) if args.central else (CMD_STREAM, STATE_STREAM)
            vehicle = await resolve.vehicle(nc, args.env, args.vid, needs=needs,
                                            force="queue it anyway", allow_unknown=args.force)
        except MavjetError as exc:
            print(f"mavjet cmd: {exc}", file=sys.stderr)
            return EXIT_USAGE
        if vehicle.gone or not vehicle.known:
            if not args.force:
                print(f"mavjet cmd: {vehicle.gone_text()}: the command would wait in TWIN_CMD until its deadline "
                      "and expire unexecuted; --force queues it anyway", file=sys.stderr)
                return EXIT_USAGE
            # Queued for a vehicle nobody serves now: say until when it waits (the gateway's default is the same).
            deadline_s = DEFAULT_DEADLINE_S if deadline_s is None else deadline_s
            who = vehicle.gone_text() if vehicle.known else f"no gateway has registered {args.vid} yet"
            print(f"mavjet cmd: warning: {who}; queued until its deadline {resolve.deadline_text(deadline_s)}: "
                  f"it expires unexecuted unless a gateway serves {args.vid} by then", file=sys.stderr)
        async with CommandClient(nc, args.env, issuer=args.issuer, results_from_stream=args.central) as client:
            cmd_id = args.cmd_id or new_command_id()
            if args.wait:
                client.expect(cmd_id, args.vid)
            t0 = time.monotonic()
            try:
                await client.publish(args.vid, args.name, params, cmd_id=cmd_id, deadline_s=deadline_s)
            except DuplicateCommand as exc:
                print(f"mavjet cmd: {exc}; use a new --id, or read the first one's result with "
                      f"mavjet events --vid {args.vid} --type cmd_result", file=sys.stderr)
                return EXIT_DUPLICATE
            except Exception as exc:  # nats-py raises a wide range (no stream, timeout...)
                print(f"mavjet cmd: publishing failed: {type(exc).__name__}: {exc} "
                      "(is TWIN_CMD provisioned? mavjet provision)", file=sys.stderr)
                return EXIT_NATS
            if not args.wait:
                print(json.dumps({"cmd_id": cmd_id, "published": True}) if args.json else cmd_id)
                return EXIT_ACCEPTED
            try:
                res = await client.wait(cmd_id, timeout_s, vid=args.vid)
            except ResultTimeout as exc:
                print(f"mavjet cmd: {exc} (is a gateway serving {args.vid}?)", file=sys.stderr)
                return EXIT_TIMEOUT
            rtt_ms = (time.monotonic() - t0) * 1000.0
    finally:
        await nc.close()
    if args.json:
        print(json.dumps({**res.data, "vid": res.vid, "roundtrip_ms": round(rtt_ms, 2)}, default=str))
    else:
        mav = "" if res.mav_result is None else f" mav_result={res.mav_result}"
        detail = f" — {res.detail}" if res.detail else ""
        print(f"{res.vid} {res.name} {res.cmd_id}: {res.result}{mav} attempts={res.attempts} "
              f"latency={res.latency_ms:.1f} ms round-trip={rtt_ms:.1f} ms{detail}")
        for text in res.data.get("vehicle_text") or ():  # what the autopilot said while it ran
            print(f"  vehicle: {text}")
    return EXIT_ACCEPTED if res.accepted else EXIT_NOT_ACCEPTED


def main(argv: list[str]) -> int:
    return run_cli(build_parser(), run, argv)
