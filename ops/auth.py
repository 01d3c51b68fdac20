"""`mavjet auth`: per-vehicle NATS identities and the permission matrix.

`mavjet auth init DIR --env ENV --vehicle VID ... [--gateway NAME=VID,VID ...]`
writes `DIR/auth.conf` (a nats-server fragment to `include`: operator JWT,
memory resolver preloaded with the account JWTs) and `DIR/creds/*.creds`.
`mavjet auth add-vehicle DIR VID` (and `add-gateway DIR NAME=VID,VID`) issues
one more credential with the account signing key kept in `DIR/keys/`, so `auth.conf` and every credential
already issued stay valid (no server reload needed). `mavjet auth revoke DIR NAME` adds NAME's user key
to the account JWT's revocations in `auth.conf`; a server configuration reload applies it.

The matrix (docs/security.md) is enforced by the server: each user JWT
carries its allow lists. They name the exact JetStream API subjects the
gateway and the CLI use, so a vehicle credential reaches its own vehicles'
subjects, consumers and shadow keys and nothing else.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from mavjet.contract.errors import ConfigError
from mavjet.contract.events import EventType
from mavjet.contract.natsconn import inbox_prefix_for_name
from mavjet.contract.subjects import (
    BLOBS_BUCKET,
    CMD_STREAM,
    EVENTS_STREAM,
    LEASES_STREAM,
    LOGS_STREAM,
    ROLLOUTS_BUCKET,
    SHADOW_BUCKET,
    SHADOW_STREAM,
    STATE_STREAM,
    TRACKS_STREAM,
    check_token,
    cmd_filter,
    command_consumer,
    lease_key,
    lease_kv_subject,
    logs_prefix,
    presence_filter,
    shadow_kv_subject,
    track_subject,
    veh_prefix,
)
from mavjet.ops.auth_jwt import (
    ACCOUNT,
    OPERATOR,
    USER,
    NKey,
    account_jwt,
    creds_jwt,
    creds_text,
    decode_claims,
    operator_jwt,
    user_jwt,
    write_secret,
)
from mavjet.ops.runner import run_cli

API = "$JS.API"
KV_STREAM = SHADOW_STREAM
OBJ_STREAM = f"OBJ_{BLOBS_BUCKET}"
ROLLOUTS_STREAM = f"KV_{ROLLOUTS_BUCKET}"
ROLES = ("operator", "viewer", "analytics", "admin")
MANIFEST = "auth.json"
# A user JWT travels in the client's CONNECT line, which nats-server caps at 4 KiB by default:
# a hub gateway's allow lists grow with its vehicles (about 1.1 KiB of JWT each), so auth.conf
# raises the cap, and an identity whose JWT would not fit is refused when it is issued.
CONTROL_LINE_BYTES = 64 * 1024
_CONNECT_OVERHEAD_BYTES = 1024  # the CONNECT line's other fields (name, version, signature, flags)


@dataclass(frozen=True, slots=True, kw_only=True)
class Permissions:
    pub_allow: list[str]
    sub_allow: list[str]
    pub_deny: list[str]


def _kv(env: str, vid: str, doc: str) -> str:
    return shadow_kv_subject(f"{veh_prefix(env, vid)}.{doc}")


def vehicle_permissions(name: str, env: str, vids: list[str]) -> Permissions:
    """A vehicle's (or a hub gateway's) identity: its own vehicles and nothing else."""
    pub = [
        f"{API}.INFO",
        f"{API}.STREAM.NAMES",  # nats-py finds an object's stream by subject before reading it
        f"{API}.STREAM.INFO.{KV_STREAM}",
        f"{API}.STREAM.INFO.{OBJ_STREAM}",
        # mission plans: read-only object store access (flight logs go to TWIN_LOGS, below)
        f"{API}.DIRECT.GET.{OBJ_STREAM}.>",
        f"{API}.STREAM.MSG.GET.{OBJ_STREAM}",
        f"{API}.CONSUMER.CREATE.{OBJ_STREAM}",
        f"$JS.FC.{OBJ_STREAM}.>",
    ]
    sub = [f"{inbox_prefix_for_name(name)}.>"]
    for vid in vids:
        p = veh_prefix(env, vid)
        consumer = command_consumer(vid)
        pub += [
            f"{p}.state.>",
            f"{p}.evt.>",
            f"{p}.mav.down",
            f"{p}.digest.>",  # the slow state feed for a central cluster (gateway/publish/digest.py)
            # its own command consumer: created only with its own filter (the server checks
            # the filter in the subject against the request), read, pulled, acked
            f"{API}.CONSUMER.CREATE.{CMD_STREAM}.{consumer}.{cmd_filter(env, vid)}",
            f"{API}.CONSUMER.INFO.{CMD_STREAM}.{consumer}",
            f"{API}.CONSUMER.MSG.NEXT.{CMD_STREAM}.{consumer}",
            f"$JS.ACK.{CMD_STREAM}.{consumer}.>",
            # shadow: write reported/meta/config, read all four, watch desired through a filtered consumer
            _kv(env, vid, "reported"),
            _kv(env, vid, "meta"),
            _kv(env, vid, "config"),  # the gateway's own record of the link (endpoint, sysid, rates)
        ]
        # read its own four documents (desired, config, reported, meta): one entry keeps the JWT short
        pub.append(f"{API}.DIRECT.GET.{KV_STREAM}.{_kv(env, vid, '*')}")
        pub.append(f"{API}.CONSUMER.CREATE.{KV_STREAM}.*.{_kv(env, vid, 'desired')}")
        # flight logs: write and read its own TWIN_LOGS subjects only; records by direct get,
        # chunks and listings through consumers created on the filtered subject (gateway/stores/logstore.py)
        logs = logs_prefix(env, vid)
        pub += [
            f"{logs}.>",
            f"{API}.DIRECT.GET.{LOGS_STREAM}.{logs}.>",
            f"{API}.CONSUMER.CREATE.{LOGS_STREAM}.*.{logs}.>",
            track_subject(env, vid),  # the flight recorder's track (TWIN_TRACKS)
        ]
        sub.append(f"{p}.mav.up")
        # ownership (docs/ownership.md): its own vehicles' keys in TWIN_LEASES, never another vehicle's:
        # the lease and the commands in flight (written by compare-and-set) and a standby's presence
        # records (put, deleted on a clean stop), one entry for the three to keep a hub's JWT short;
        # read by a direct get whose subject names the key; the lease's subject heard (a release wakes
        # a standby)
        leases = lease_kv_subject(f"{p}.lease")
        pub += [f"{lease_kv_subject(p)}.>", f"{API}.DIRECT.GET.{LEASES_STREAM}.{lease_kv_subject(p)}.>"]
        sub.append(leases)
    if len(vids) > 1:
        # A hub gateway watches its vehicles' `desired` with one multi-filter consumer
        # (gateway/shadow/watch.py), which the server accepts only on the unfiltered named create
        # subject and cannot check against these keys: a hub may read every TWIN_SHADOW key
        # (read-only; docs/security.md). Its consumer's info is the watch's periodic check.
        pub += [f"{API}.CONSUMER.CREATE.{KV_STREAM}.*", f"{API}.CONSUMER.INFO.{KV_STREAM}.*"]
    if len(vids) > 1:
        # A hub gateway pulls its vehicles' commands through one consumer of its own, `gwx_<holder>`
        # (gateway/commands/intake.py), named per process and filtered to the vehicles it owns now. A
        # multi-filter create goes through the unfiltered subject, which the server cannot check against
        # these vehicles, and a new owner takes a dead gateway's subjects out of its consumer: a hub may
        # read and take any TWIN_CMD consumer's commands in its JetStream domain (docs/security.md).
        # Vehicle credentials (one vehicle) keep the exact `gw_<vid>` entries above.
        pub += [
            f"{API}.CONSUMER.CREATE.{CMD_STREAM}.*",
            f"{API}.CONSUMER.CREATE.{CMD_STREAM}.*.>",
            f"{API}.CONSUMER.INFO.{CMD_STREAM}.*",
            f"{API}.CONSUMER.DELETE.{CMD_STREAM}.*",
            f"{API}.CONSUMER.LIST.{CMD_STREAM}",
            f"{API}.CONSUMER.MSG.NEXT.{CMD_STREAM}.*",
            f"$JS.ACK.{CMD_STREAM}.>",
        ]
    return Permissions(pub_allow=pub, sub_allow=sub, pub_deny=[])


_ADMIN_ONLY = [
    f"{API}.STREAM.CREATE.>", f"{API}.STREAM.UPDATE.>", f"{API}.STREAM.DELETE.>",
    f"{API}.STREAM.PURGE.>", f"{API}.STREAM.MSG.DELETE.>", f"{API}.STREAM.RESTORE.>",
    f"{API}.STREAM.SNAPSHOT.>", f"{API}.CONSUMER.DURABLE.CREATE.>",
]


def _readers(name: str, streams: list[str]) -> list[str]:
    """JetStream API subjects to read `streams` with ephemeral/ordered consumers and gets."""
    pub = [f"{API}.INFO", f"{API}.STREAM.NAMES", f"{API}.STREAM.LIST"]
    for s in streams:
        pub += [
            f"{API}.STREAM.INFO.{s}",
            f"{API}.CONSUMER.CREATE.{s}",
            f"{API}.CONSUMER.CREATE.{s}.>",
            f"{API}.CONSUMER.INFO.{s}.>",
            f"{API}.CONSUMER.DELETE.{s}.>",
            f"{API}.CONSUMER.MSG.NEXT.{s}.>",
            f"{API}.STREAM.MSG.GET.{s}",
            f"{API}.DIRECT.GET.{s}",
            f"{API}.DIRECT.GET.{s}.>",
            f"$JS.FC.{s}.>",
        ]
    return pub


def _gateways_readers(env: str) -> list[str]:
    """Who serves each vehicle (`mavjet twin`, `mavjet fleet`): leases by direct get, presence records through
    consumers created on their filtered subject; not the commands in flight beside them in TWIN_LEASES."""
    return [
        f"{API}.DIRECT.GET.{LEASES_STREAM}.{lease_kv_subject(lease_key(env, '*'))}",
        f"{API}.CONSUMER.CREATE.{LEASES_STREAM}.*.{presence_filter(env)}",
        f"{API}.CONSUMER.DELETE.{LEASES_STREAM}.*",
    ]


def role_permissions(role: str, env: str) -> Permissions:
    inbox = f"{inbox_prefix_for_name(role)}.>"
    if role == "admin":
        return Permissions(pub_allow=[">"], sub_allow=[">"], pub_deny=[])
    if role == "viewer":
        return Permissions(
            pub_allow=[*_readers(role, [STATE_STREAM, EVENTS_STREAM, KV_STREAM, TRACKS_STREAM]), *_gateways_readers(env)],
            sub_allow=[inbox, f"fleet.{env}.veh.*.state.>", f"fleet.{env}.veh.*.evt.>", track_subject(env, "*")],
            pub_deny=[],
        )
    if role == "analytics":
        return Permissions(
            pub_allow=[*_readers(role, [EVENTS_STREAM, TRACKS_STREAM]), f"$JS.ACK.{EVENTS_STREAM}.>",
                       f"$JS.ACK.{TRACKS_STREAM}.>"],
            sub_allow=[inbox],
            pub_deny=[],
        )
    if role == "operator":
        streams = [STATE_STREAM, EVENTS_STREAM, KV_STREAM, OBJ_STREAM, LOGS_STREAM, TRACKS_STREAM, ROLLOUTS_STREAM]
        return Permissions(
            pub_allow=[
                *_readers(role, streams),
                *_gateways_readers(env),
                # TWIN_CMD: look, never pull or delete (a pull from gw_<vid> would take a vehicle's command)
                f"{API}.STREAM.INFO.{CMD_STREAM}",
                f"{API}.CONSUMER.INFO.{CMD_STREAM}.>",
                f"{API}.CONSUMER.LIST.{CMD_STREAM}",
                f"{API}.CONSUMER.NAMES.{CMD_STREAM}",
                f"$JS.ACK.{EVENTS_STREAM}.>",
                f"fleet.{env}.veh.*.cmd.>",
                f"fleet.{env}.veh.*.mav.up",
                f"$KV.{SHADOW_BUCKET}.fleet.{env}.veh.*.desired",
                f"$O.{BLOBS_BUCKET}.>",
                # fleet rollouts (docs/rollout.md): their state and tags, their events in the audit trail
                f"$KV.{ROLLOUTS_BUCKET}.>",
                f"fleet.{env}.rollout.*.evt.>",
                f"fleet.{env}.veh.*.evt.{EventType.ROLLOUT_VEHICLE}",
            ],
            sub_allow=[">"],
            # Deny lists win over allow lists in the server: belt and braces for the destructive ones.
            pub_deny=_ADMIN_ONLY,
        )
    raise ConfigError("auth.role", f"unknown role {role!r}")


# -- the directory ------------------------------------------------------------------


def _name(kind: str, value: str) -> str:
    try:
        return check_token(kind, value)
    except Exception as exc:
        raise ConfigError(f"auth.{kind}", f"{value!r}: letters, digits, '-' and '_' only") from exc


def _issue(d: Path, signing: NKey, account: str, name: str, perms: Permissions) -> Path:
    user = NKey.create(USER)
    token = user_jwt(signing, user.public, name, account=account, pub_allow=perms.pub_allow,
                     sub_allow=perms.sub_allow, pub_deny=perms.pub_deny)
    if len(token) + _CONNECT_OVERHEAD_BYTES > CONTROL_LINE_BYTES:
        raise ConfigError("auth.identity", f"{name}: its permissions make a {len(token)}-byte JWT, too long for a "
                          f"CONNECT line of {CONTROL_LINE_BYTES} bytes: split its vehicles over more gateways")
    path = d / "creds" / f"{name}.creds"
    write_secret(path, creds_text(token, user.seed))
    return path


def _load(d: Path) -> tuple[dict[str, object], NKey]:
    manifest = d / MANIFEST
    if not manifest.is_file():
        raise ConfigError("auth.dir", f"{d} has no {MANIFEST}: run `mavjet auth init` first")
    data: dict[str, object] = json.loads(manifest.read_text())
    signing = NKey.from_seed((d / "keys" / "account-signing.nk").read_bytes())
    return data, signing


def init(d: Path, *, env: str, vehicles: list[str], gateways: dict[str, list[str]], force: bool = False) -> list[Path]:
    if (d / MANIFEST).exists() and not force:
        raise ConfigError("auth.dir", f"{d} already holds an auth setup (--force replaces every credential)")
    env = _name("env", env)
    for vid in vehicles:
        _name("vid", vid)
    for gw, vids in gateways.items():
        _name("gateway", gw)
        for vid in vids:
            _name("vid", vid)
    operator, account, signing, system = (NKey.create(OPERATOR), NKey.create(ACCOUNT),
                                          NKey.create(ACCOUNT), NKey.create(ACCOUNT))
    keys = d / "keys"
    for key_name, key in (("operator", operator), ("account", account), ("account-signing", signing)):
        write_secret(keys / f"{key_name}.nk", key.seed.decode() + "\n")
    op = operator_jwt(operator, "mavjet", system_account=system.public)
    acc = account_jwt(operator, account.public, "MAVJET", signing_keys=[signing.public], jetstream=True)
    sys_acc = account_jwt(operator, system.public, "SYS", signing_keys=[], jetstream=False)
    conf = (
        "# NATS decentralized auth for mavjet, written by `mavjet auth init`: include it\n"
        "# from the server configuration. Holds no secret (JWTs are public, signed by the keys in keys/).\n"
        f"operator: {op}\n"
        f"system_account: {system.public}\n"
        f"max_control_line: {CONTROL_LINE_BYTES}  # a hub gateway's JWT (its vehicles' allow lists) exceeds 4 KiB\n"
        "resolver: MEMORY\n"
        "resolver_preload: {\n"
        f"  {account.public}: {acc}\n"
        f"  {system.public}: {sys_acc}\n"
        "}\n"
    )
    (d / "auth.conf").write_text(conf)
    identities = [(vid, vehicle_permissions(vid, env, [vid])) for vid in vehicles]
    identities += [(gw, vehicle_permissions(gw, env, vids)) for gw, vids in gateways.items()]
    identities += [(role, role_permissions(role, env)) for role in ROLES]
    written = [d / "auth.conf"]
    written += [_issue(d, signing, account.public, name, perms) for name, perms in identities]
    manifest = {"env": env, "account": account.public, "vehicles": vehicles, "gateways": gateways}
    (d / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return written


def add_vehicle(d: Path, vid: str) -> Path:
    data, signing = _load(d)
    vid = _name("vid", vid)
    env, account = str(data["env"]), str(data["account"])
    path = _issue(d, signing, account, vid, vehicle_permissions(vid, env, [vid]))
    vehicles = [str(v) for v in data.get("vehicles", []) or []]  # type: ignore[attr-defined]
    if vid not in vehicles:
        data["vehicles"] = [*vehicles, vid]
        (d / MANIFEST).write_text(json.dumps(data, indent=2) + "\n")
    return path


def add_gateway(d: Path, name: str, vids: list[str]) -> Path:
    """A (new) hub gateway credential for `vids`; an older credential of the same name stays valid until --force."""
    data, signing = _load(d)
    name = _name("gateway", name)
    vids = [_name("vid", v) for v in vids]
    path = _issue(d, signing, str(data["account"]), name, vehicle_permissions(name, str(data["env"]), vids))
    gateways = dict(data.get("gateways", {}) or {})  # type: ignore[call-overload]
    gateways[name] = vids
    data["gateways"] = gateways
    (d / MANIFEST).write_text(json.dumps(data, indent=2) + "\n")
    return path


def revoke(d: Path, name: str, *, at_s: int | None = None) -> Path:
    """Revoke the credential `name`: its user key goes into the account JWT's revocations, `auth.conf` is rewritten.

    The running servers apply it on a configuration reload (`nats-server
    --signal reload`, or SIGHUP): with a memory resolver a reload re-reads the
    preloaded account JWTs and updates each account's claims, which refuses
    the revoked key from then on and closes its open connections. Every
    other credential stays valid. The credential file is deleted; `mavjet auth
    add-vehicle` (or `add-gateway`) issues a new one with a new key.
    """
    data, signing = _load(d)
    name = _name("name", name)
    creds = d / "creds" / f"{name}.creds"
    if not creds.is_file():
        raise ConfigError("auth.name", f"{d} has no credential {name!r} (creds/{name}.creds)")
    if name == "admin":
        raise ConfigError("auth.name", "admin cannot be revoked this way: run `mavjet auth init --force`")
    try:
        user = str(decode_claims(creds_jwt(creds.read_text()))["sub"])
    except (ValueError, KeyError) as exc:
        raise ConfigError("auth.name", f"creds/{name}.creds: {exc}") from exc
    revocations = {str(k): int(v) for k, v in dict(data.get("revocations", {}) or {}).items()}  # type: ignore[call-overload]
    revocations[user] = int(time.time()) if at_s is None else at_s
    account = str(data["account"])
    operator = NKey.from_seed((d / "keys" / "operator.nk").read_bytes())
    acc = account_jwt(operator, account, "MAVJET", signing_keys=[signing.public], jetstream=True,
                      revocations=revocations)
    conf_path = d / "auth.conf"
    lines = conf_path.read_text().splitlines()
    at = [i for i, line in enumerate(lines) if line.strip().startswith(f"{account}:")]
    if len(at) != 1:
        raise ConfigError("auth.conf", f"{conf_path}: no resolver_preload entry for account {account}")
    lines[at[0]] = f"  {account}: {acc}"
    conf_path.write_text("\n".join(lines) + "\n")
    data["revocations"] = revocations
    revoked = dict(data.get("revoked", {}) or {})  # type: ignore[call-overload]
    revoked[name] = [*revoked.get(name, []), user]
    data["revoked"] = revoked
    (d / MANIFEST).write_text(json.dumps(data, indent=2) + "\n")
    creds.unlink()
    return conf_path


def _gateway_arg(text: str) -> tuple[str, list[str]]:
    name, sep, vids = text.partition("=")
    if not sep or not name or not vids:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=VID[,VID...]")
    return name, [v.strip() for v in vids.split(",") if v.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mavjet auth", description=(__doc__ or "").split("\n\n")[0])
    sub = p.add_subparsers(dest="action", required=True)
    pi = sub.add_parser("init", help="new operator, account and credentials in DIR")
    pi.add_argument("dir", type=Path, help="where the keys, auth.conf and creds/ go (keep it private)")
    pi.add_argument("--env", default="prod", help="the fleet environment the subjects are scoped to (default %(default)s)")
    pi.add_argument("--vehicle", action="append", default=[], metavar="VID", help="a vehicle credential (repeatable)")
    pi.add_argument("--gateway", action="append", default=[], type=_gateway_arg, metavar="NAME=VID,VID",
                    help="a hub gateway credential that serves these vehicles (repeatable)")
    pi.add_argument("--force", action="store_true", help="replace an existing setup (invalidates every credential)")
    pa = sub.add_parser("add-vehicle", help="one more vehicle credential; the others stay valid")
    pa.add_argument("dir", type=Path, help="the directory `mavjet auth init` made")
    pa.add_argument("vid", help="the vehicle id")
    pg = sub.add_parser("add-gateway", help="a hub gateway credential for NAME=VID,VID (the others stay valid)")
    pg.add_argument("dir", type=Path, help="the directory `mavjet auth init` made")
    pg.add_argument("gateway", type=_gateway_arg, metavar="NAME=VID,VID", help="the gateway's name and its vehicles")
    pr = sub.add_parser("revoke", help="revoke NAME's credential (the servers apply it on a config reload)")
    pr.add_argument("dir", type=Path, help="the directory `mavjet auth init` made")
    pr.add_argument("name", help="a vehicle, gateway or role name (its creds/NAME.creds)")
    return p


def run(args: argparse.Namespace) -> int:
    """Prints the paths written, never a key."""
    if args.action == "init":
        for path in init(args.dir, env=args.env, vehicles=list(args.vehicle), gateways=dict(args.gateway),
                         force=args.force):
            print(path)
    elif args.action == "add-gateway":
        print(add_gateway(args.dir, *args.gateway))
    elif args.action == "revoke":
        print(revoke(args.dir, args.name))
        print(f"revoked {args.name}: reload the servers (nats-server --signal reload) to apply it", file=sys.stderr)
    else:
        print(add_vehicle(args.dir, args.vid))
    return 0


def main(argv: list[str]) -> int:
    return run_cli(build_parser(), run, argv, errors=(OSError,))
