"""`mavjet`: one entry point, a module per subcommand.

Each subcommand lives in its own module exposing `main(argv) -> int`, imported
only when used, so `mavjet twin` does not pay for pyspark and `mavjet gateway`
does not import the simulator. The modules are found through the
`mavjet.commands` entry-point group (pyproject.toml), not named here: the
simulator, the analytics jobs and the benchmarks sit beside or above the
daemon in the layering (docs/architecture.md), and naming them here would make
the daemon package depend on them.
"""

from __future__ import annotations

import importlib.metadata
import sys

# name -> (module, one-line help). Order is the order shown in --help.
COMMANDS: dict[str, str] = {
    "gateway": "run the gateway daemon (MAVLink vehicles -> JetStream twins)",
    "provision": "create/update the JetStream streams, KV and object store",
    "demo": "nats-server + provisioning + simulated fleet + gateway, shown live",
    "sim": "run simulated vehicles that speak MAVLink like ArduPilot SITL",
    "twin": "print a vehicle's current state and last events",
    "events": "tail the event audit trail in readable form",
    "fleet": "live table of every vehicle's twin",
    "cmd": "send a command to a vehicle through TWIN_CMD",
    "mission": "store mission plans in TWIN_BLOBS",
    "blobs": "hash-addressed, resumable artifacts in TWIN_BLOBS: ls, get, put",
    "shadow": "read, write and watch shadow documents",
    "rollout": "apply a shadow change to many vehicles in waves (canary, %), resumable, with rollback",
    "replay": "replay the audit trail with Spark into Parquet and a report",
    "synth": "publish a synthetic, deterministic event history (analytics test data)",
    "bench": "benchmarks: ingest, commands, mixed, shadow, replay, uplink, consumers, overload, scrape, scale, shadow-watch, "
             "failover, compare",
    "monitor": "export JetStream stream health as Prometheus metrics",
    "backup": "back up streams, KV history and objects to a directory",
    "restore": "restore a backup into a server",
    "migrate": "move the twin's streams to another cluster with mirrors",
    "auth": "per-vehicle NATS credentials and the permission matrix (auth.conf + creds)",
    "sign": "MAVLink 2 signing: make a key, provision it on a vehicle (SETUP_SIGNING)",
    "tunnel": "a vehicle's raw MAVLink over NATS on a local port, for QGroundControl or MAVProxy",
    "logs": "a vehicle's flight logs: ls (the vehicle's list; --stored: in TWIN_LOGS), get (download from the vehicle)",
    "compile": "compile the per-message hot path with mypyc (optional; same code, less CPU)",
    "completion": "print a shell completion script: mavjet completion bash|zsh",
}

GROUP = "mavjet.commands"


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=GROUP)}


def usage() -> str:
    lines = ["usage: mavjet <command> [options]   (mavjet <command> --help for details)", "", "commands:"]
    available = _entry_points()
    for name, text in COMMANDS.items():
        if name in available:
            lines.append(f"  {name:<10} {text}")
    lines += ["", "NATS options on every command that connects: --nats URL[,URL...] --env ENV --creds FILE"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from mavjet.contract import __version__

        print(f"mavjet {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    entry = _entry_points().get(name)
    if entry is None:
        print(f"mavjet: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    try:
        command = entry.load()
    except ModuleNotFoundError as exc:
        print(f"mavjet {name}: not available in this install ({exc.name} missing)", file=sys.stderr)
        return 2
    rc: int = command(rest)
    return rc


if __name__ == "__main__":
    sys.exit(main())
