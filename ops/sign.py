"""`mavjet sign`: MAVLink 2 signing keys for vehicles (docs/signing.md).

    mavjet sign keygen FILE
        write a new random 32-byte key as 64 hex digits (file mode 0600; an existing file is kept)
    mavjet sign setup VID [--config gateway.toml] [--endpoint EP] [--key-file FILE] [--sysid N]
                          [--timeout S] [--disable]
        provision the key on the vehicle: send SETUP_SIGNING (the key, timestamp now) over its MAVLink
        endpoint, then wait until a HEARTBEAT signed with the key arrives. Exit 0 when the vehicle signs
        with the key, 1 when it does not within the timeout, 2 for a bad argument or file.

Provisioning goes straight to the vehicle's endpoint, not through the
gateway and TWIN_CMD: a gateway configured with the key drops everything an
unprovisioned vehicle sends, so it could never see the link up to run a
command, and a command body would put the secret key into a JetStream stream.
The endpoint and the key file are the vehicle's entry in the gateway's
config (`--config`), or given with `--endpoint`/`--key-file`. SITL's and a
flight controller's first port (SERIAL0/USB) takes one client at a time: stop
the gateway, or use another MAVLink port of the vehicle (the key applies to
every link). Once signing is on, ArduPilot accepts SETUP_SIGNING on links
other than SERIAL0 only when it is signed with the current key.
"""

from __future__ import annotations

import argparse
import os
import secrets
import time
from pathlib import Path

import anyio

from mavjet.contract.errors import ConfigError, LinkError
from mavjet.drivers.mavlink.autopilot import is_autopilot_heartbeat
from mavjet.drivers.mavlink.codec import MavCodec
from mavjet.drivers.mavlink.signing import KEY_LEN, MavSigning, read_key_file, setup_signing_message
from mavjet.drivers.mavlink.transport import Endpoint, open_transport
from mavjet.gateway.resolve import build_config, load_toml
from mavjet.ops.runner import duration, run_cli

EXIT_NOT_SIGNING = 1


def keygen(path: Path) -> None:
    """Write a new random key (hex) readable by its owner only; refuse to overwrite a key."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ConfigError("FILE", f"{path} exists: a key in use is not overwritten") from None
    except OSError as exc:
        raise ConfigError("FILE", f"cannot create {path}: {exc.strerror or exc}") from exc
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_bytes(KEY_LEN).hex() + "\n")


async def provision(endpoint: Endpoint, key: bytes, *, sysid: int | None = None, timeout_s: float = 10.0,
                    connect_timeout_s: float = 5.0) -> bool:
    """Send SETUP_SIGNING to the autopilot at `endpoint`; True once its HEARTBEAT verifies with `key`.

    An all-zero `key` disables signing: True once an unsigned autopilot HEARTBEAT arrives.
    """
    disable = not any(key)
    transport = await open_transport(endpoint, connect_timeout_s=connect_timeout_s)
    plain = MavCodec()  # before SETUP_SIGNING: find the autopilot, whatever it signs with
    plain.resync()
    checked = MavCodec(signing=MavSigning(key)) if not disable else MavCodec()
    target: int | None = sysid
    sent = False
    try:
        with anyio.move_on_after(timeout_s):
            while True:
                data = await transport.recv()
                if not sent:
                    for msg in plain.feed(data):
                        if msg.get_type() == "HEARTBEAT" and is_autopilot_heartbeat(msg.type, msg.autopilot) and (
                                target is None or msg.get_srcSystem() == target):
                            target = msg.get_srcSystem()
                            await transport.send(plain.encode(setup_signing_message(
                                key, target_system=target, target_component=msg.get_srcComponent(),
                                wall_s=time.time())))
                            sent = True
                            checked.resync()
                            break
                    continue
                for msg in checked.feed(data):
                    if msg.get_type() == "HEARTBEAT" and msg.get_srcSystem() == target and (
                            not disable or not msg.get_header().incompat_flags & 1):
                        return True
    finally:
        with anyio.CancelScope(shield=True):
            await transport.aclose()
    return False


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mavjet sign", description="MAVLink 2 signing keys for vehicles")
    sub = p.add_subparsers(dest="action", required=True)
    kg = sub.add_parser("keygen", help="write a new random 32-byte key (hex, mode 0600)")
    kg.add_argument("file", type=Path, help="where to write the key (refused if it exists)")
    st = sub.add_parser("setup", help="provision the key on a vehicle with SETUP_SIGNING")
    st.add_argument("vid", help="the vehicle id (its [[vehicles]] entry in --config)")
    st.add_argument("--config", type=Path, help="the gateway's config: the vehicle's endpoint and signing_key_file")
    st.add_argument("--endpoint", help="the vehicle's MAVLink endpoint (overrides --config)")
    st.add_argument("--key-file", type=Path, help="32-byte key, hex or raw (overrides --config)")
    st.add_argument("--sysid", type=int, help="the vehicle's system id (default: the first autopilot heard)")
    st.add_argument("--timeout", type=duration, default=10.0, help="wait this long for a signed heartbeat, e.g. 10s (default: 10s)")
    st.add_argument("--disable", action="store_true", help="turn signing off (all-zero key, timestamp 0)")
    return p


def _target(args: argparse.Namespace) -> tuple[Endpoint, Path | None, int | None]:
    endpoint = Endpoint.parse(args.endpoint) if args.endpoint else None
    key_file: Path | None = args.key_file
    sysid: int | None = args.sysid
    if args.config is not None:
        try:
            raw = load_toml(args.config)
        except OSError as exc:
            raise ConfigError("--config", f"cannot read {args.config}: {exc.strerror or exc}") from exc
        found = [v for v in build_config(raw).vehicles if v.vid == args.vid]
        if not found:
            raise ConfigError("VID", f"{args.vid} is not a vehicle of {args.config}")
        v = found[0]
        endpoint = endpoint or v.endpoint
        key_file = key_file or v.signing_key_file
        sysid = sysid if sysid is not None else v.sysid
    if endpoint is None:
        raise ConfigError("--endpoint", f"no endpoint for {args.vid}: give --endpoint or --config")
    if key_file is None and not args.disable:
        raise ConfigError("--key-file", f"no key for {args.vid}: give --key-file or a signing_key_file in --config")
    return endpoint, key_file, sysid


async def _setup(args: argparse.Namespace) -> int:
    endpoint, key_file, sysid = _target(args)
    key = bytes(KEY_LEN) if args.disable else read_key_file(key_file or Path(), source="--key-file")
    try:
        ok = await provision(endpoint, key, sysid=sysid, timeout_s=args.timeout)
    except LinkError as exc:
        raise ConfigError("--endpoint", f"{endpoint}: {exc.reason}") from exc
    state = "off" if args.disable else "on"
    if ok:
        print(f"{args.vid}: signing {state} ({endpoint})")
        return 0
    print(f"{args.vid}: no {'unsigned' if args.disable else 'signed'} heartbeat within {args.timeout:g} s "
          f"after SETUP_SIGNING ({endpoint}): signing is not {state}")
    return EXIT_NOT_SIGNING


def _run(args: argparse.Namespace) -> int:
    if args.action == "keygen":
        keygen(args.file)
        print(f"key written to {args.file}")
        return 0
    return anyio.run(_setup, args)


def main(argv: list[str]) -> int:
    return run_cli(build_parser(), _run, argv)
