"""`mavjet migrate`: move the twin's streams to another cluster with mirrors.

Seed 000's five steps, as subcommands (docs/operations.md has the runbook):

1. + 2. `mirror`: create each stream on the target with the source's exact
   configuration, but as a mirror of the original (a mirror has no subjects
   of its own; the source's subjects come back at promotion). A mirror keeps
   sequence numbers, timestamps, headers and the Nats-Msg-Id de-duplication
   state, so KV revisions and analytics offsets stay valid.
3. `status --wait`: until every mirror has caught up (lag 0, same last sequence).
4. `promote`: once producers are stopped and the mirrors are in sync, turn the
   mirrors into ordinary streams with the source's subjects; then point the
   gateways, operators and consumers at the target.
5. `remove --yes`: delete the original streams.

TWIN_CMD is not mirrored: a workqueue's retention cannot be changed after
creation, and its contents live five minutes. It is provisioned fresh on the
target; the old queue drains (or expires) while issuers move first.

The target reaches the source's JetStream API through a leaf node or gateway
connection, as `$JS.<source domain>.API` (`--from-domain`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from nats.aio.client import Client

from mavjet.contract import natsconn
from mavjet.contract.subjects import CMD_STREAM, check_token
from mavjet.ops.backup import BackupError, api_request, list_streams
from mavjet.ops.health import is_twin_stream
from mavjet.ops.runner import duration, run_cli


@dataclass(frozen=True, slots=True, kw_only=True)
class MirrorStatus:
    stream: str
    source_last_seq: int
    target_last_seq: int
    lag: int
    error: str | None

    @property
    def in_sync(self) -> bool:
        return self.error is None and self.lag == 0 and self.target_last_seq >= self.source_last_seq


def mirror_config(source_cfg: dict[str, Any], *, source_domain: str | None) -> dict[str, Any]:
    """Pure: the target's config for a stream: the source's, as a mirror of it."""
    cfg = {k: v for k, v in source_cfg.items() if k not in ("subjects", "sources", "mirror", "sealed")}
    mirror: dict[str, Any] = {"name": source_cfg["name"]}
    if source_domain:
        mirror["external"] = {"api": f"$JS.{source_domain}.API"}
    cfg["mirror"] = mirror
    return cfg


def promoted_config(target_cfg: dict[str, Any], source_cfg: dict[str, Any]) -> dict[str, Any]:
    """Pure: the mirror's config turned into an ordinary stream with the source's subjects."""
    cfg = {k: v for k, v in target_cfg.items() if k != "mirror"}
    cfg["subjects"] = list(source_cfg.get("subjects") or [])
    return cfg


async def _config(nc: Client, name: str, timeout_s: float) -> dict[str, Any]:
    info = await api_request(nc, f"STREAM.INFO.{name}", timeout_s=timeout_s)
    cfg: dict[str, Any] = info["config"]
    return cfg


async def _twin_streams(nc: Client, timeout_s: float) -> list[str]:
    return [s for s in await list_streams(nc, timeout_s=timeout_s) if is_twin_stream(s) and s != CMD_STREAM]


async def create_mirrors(src: Client, dst: Client, *, source_domain: str | None, streams: list[str] | None = None,
                         timeout_s: float = 5.0) -> list[str]:
    names = streams or await _twin_streams(src, timeout_s)
    for name in names:
        if name == CMD_STREAM:
            raise BackupError(name, "a workqueue is not mirrored: provision it fresh on the target")
        cfg = mirror_config(await _config(src, name, timeout_s), source_domain=source_domain)
        await api_request(dst, f"STREAM.CREATE.{name}", cfg, timeout_s=timeout_s)
    return names


async def mirror_status(src: Client, dst: Client, *, streams: list[str] | None = None,
                        timeout_s: float = 5.0) -> list[MirrorStatus]:
    names = streams or await _twin_streams(src, timeout_s)
    out: list[MirrorStatus] = []
    for name in names:
        s = await api_request(src, f"STREAM.INFO.{name}", timeout_s=timeout_s)
        t = await api_request(dst, f"STREAM.INFO.{name}", timeout_s=timeout_s)
        mirror = t.get("mirror") or {}
        err = mirror.get("error")
        out.append(MirrorStatus(
            stream=name,
            source_last_seq=int(s["state"].get("last_seq", 0)),
            target_last_seq=int(t["state"].get("last_seq", 0)),
            lag=int(mirror.get("lag", 0)),
            error=(err.get("description") if isinstance(err, dict) else str(err)) if err else
                  (None if mirror else "not a mirror"),
        ))
    return out


async def wait_in_sync(src: Client, dst: Client, *, streams: list[str] | None = None, timeout_s: float = 60.0,
                       poll_s: float = 0.5) -> list[MirrorStatus]:
    deadline = time.monotonic() + timeout_s
    while True:
        status = await mirror_status(src, dst, streams=streams)
        if all(st.in_sync for st in status):
            return status
        if time.monotonic() > deadline:
            behind = ", ".join(f"{st.stream} ({st.target_last_seq}/{st.source_last_seq})"
                               for st in status if not st.in_sync)
            raise BackupError("", f"mirrors not in sync after {timeout_s:.0f}s: {behind}")
        await asyncio.sleep(poll_s)


async def promote(src: Client, dst: Client, *, streams: list[str] | None = None, timeout_s: float = 5.0) -> list[str]:
    """Stop mirroring and give each target stream the source's subjects (producers must be stopped)."""
    await wait_in_sync(src, dst, streams=streams, timeout_s=timeout_s * 6)
    names = streams or await _twin_streams(src, timeout_s)
    for name in names:
        cfg = promoted_config(await _config(dst, name, timeout_s), await _config(src, name, timeout_s))
        await api_request(dst, f"STREAM.UPDATE.{name}", cfg, timeout_s=timeout_s)
    return names


async def remove_originals(src: Client, *, streams: list[str] | None = None, timeout_s: float = 5.0) -> list[str]:
    names = streams or [s for s in await list_streams(src, timeout_s=timeout_s) if is_twin_stream(s)]
    for name in names:
        await api_request(src, f"STREAM.DELETE.{name}", timeout_s=timeout_s)
    return names


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mavjet migrate",
                                description="Move the twin's streams to another cluster with mirrors "
                                            "(docs/operations.md, 'Migration between clusters').")
    p.add_argument("step", choices=["mirror", "status", "promote", "remove"],
                   help="mirror: mirror the twin's streams on the target; status: each mirror's lag; promote: stop "
                        "mirroring, the target's streams take the subjects (producers stopped); remove: delete "
                        "the source's streams")
    p.add_argument("--from", dest="source", required=True, help="source server URL(s), comma-separated")
    p.add_argument("--to", dest="target", help="target server URL(s) (all steps but remove)")
    p.add_argument("--from-domain", help="the source's JetStream domain, as the target reaches it")
    p.add_argument("--creds", help="credentials file for both sides (or --from-creds / --to-creds)")
    p.add_argument("--from-creds", help="credentials file for the source")
    p.add_argument("--to-creds", help="credentials file for the target")
    p.add_argument("--tls-ca", help="CA bundle to verify both sides' servers")
    p.add_argument("--tls-cert", help="client certificate (with --tls-key), both sides")
    p.add_argument("--tls-key", help="client key (with --tls-cert), both sides")
    p.add_argument("--env", default=os.environ.get("MAVJET_ENV", "prod"),
                   help="fleet environment, as every command takes it; the TWIN_* streams hold every environment, so all move together (default: $MAVJET_ENV or prod)")
    p.add_argument("--streams", help="comma-separated stream names (default: the TWIN_* streams)")
    p.add_argument("--wait", type=duration, default=0.0, help="status: wait up to this long for sync, e.g. 2m (default: no wait)")
    p.add_argument("--yes", action="store_true", help="remove: really delete the original streams")
    p.add_argument("--json", action="store_true", help="status: one object per stream (for scripts)")
    return p


async def run(args: argparse.Namespace) -> int:
    streams = [s.strip() for s in args.streams.split(",") if s.strip()] if args.streams else None

    check_token("env", args.env)

    def opts(urls: str, name: str, creds: str | None) -> natsconn.NatsOptions:
        return natsconn.NatsOptions(servers=tuple(u.strip() for u in urls.split(",") if u.strip()),
                                    creds_file=creds or args.creds, tls_ca=args.tls_ca, tls_cert=args.tls_cert,
                                    tls_key=args.tls_key, name=name)

    src = await natsconn.connect_once(opts(args.source, "mavjet-migrate-source", args.from_creds))
    dst = None
    try:
        if args.step == "remove":
            if not args.yes:
                print("mavjet migrate remove: deletes the original streams; pass --yes", file=sys.stderr)
                return 2
            for n in await remove_originals(src, streams=streams):
                print(f"removed {n}")
            return 0
        if not args.target:
            print(f"mavjet migrate {args.step}: --to is required", file=sys.stderr)
            return 2
        dst = await natsconn.connect_once(opts(args.target, "mavjet-migrate-target", args.to_creds))
        if args.step == "mirror":
            for n in await create_mirrors(src, dst, source_domain=args.from_domain, streams=streams):
                print(f"mirroring {n}")
        elif args.step == "status":
            status = (await wait_in_sync(src, dst, streams=streams, timeout_s=args.wait) if args.wait
                      else await mirror_status(src, dst, streams=streams))
            if args.json:
                print(json.dumps([{**dataclasses.asdict(st), "in_sync": st.in_sync} for st in status], indent=2))
                return 0 if all(st.in_sync for st in status) else 1
            for st in status:
                state = "in sync" if st.in_sync else (st.error or f"lag {st.lag}")
                print(f"{st.stream:16} source {st.source_last_seq:>9} target {st.target_last_seq:>9}  {state}")
            return 0 if all(st.in_sync for st in status) else 1
        else:
            for n in await promote(src, dst, streams=streams):
                print(f"promoted {n}")
        return 0
    finally:
        await src.close()
        if dst is not None:
            await dst.close()


def main(argv: list[str]) -> int:
    return run_cli(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
