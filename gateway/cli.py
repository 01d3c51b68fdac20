"""`mavjet`: one entry point, a module per subcommand.

Each subcommand lives in its own module exposing `main(argv) -> int`, imported
only when used, so `mavjet twin` does not pay for pyspark and `mavjet gateway`
does not import the simulator.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

# name -> (module, one-line help). Order is the order shown in --help.
COMMANDS: dict[str, tuple[str, str]] = {
    "gateway": ("gateway.daemon", "run the gateway daemon (MAVLink vehicles -> JetStream twins)"),
    "provision": ("gateway.provision", "create/update the JetStream streams, KV and object store"),
    "demo": ("gateway.demo", "nats-server + provisioning + simulated fleet + gateway, shown live"),
    "sim": ("sim.cli", "run simulated vehicles that speak MAVLink like ArduPilot SITL"),
    "twin": ("gateway.ops.twin", "print a vehicle's current state and last events"),
    "events": ("gateway.ops.events", "tail the event audit trail in readable form"),
    "fleet": ("gateway.ops.fleet", "live table of every vehicle's twin"),
    "cmd": ("gateway.ops.cmd", "send a command to a vehicle through TWIN_CMD"),
    "mission": ("gateway.ops.mission", "store mission plans in TWIN_BLOBS"),
    "shadow": ("gateway.ops.shadow", "read, write and watch shadow documents"),
    "replay": ("analytics.replay", "replay the audit trail with Spark into Parquet and a report"),
    "bench": ("gateway.bench", "benchmarks: ingest, commands, shadow, replay"),
    "monitor": ("gateway.ops.monitor", "export JetStream stream health as Prometheus metrics"),
    "backup": ("gateway.ops.backup", "back up streams, KV history and objects to a directory"),
    "restore": ("gateway.ops.restore", "restore a backup into a server"),
    "migrate": ("gateway.ops.migrate", "move the twin's streams to another cluster with mirrors"),
}


def usage() -> str:
    lines = ["usage: mavjet <command> [options]   (mavjet <command> --help for details)", "", "commands:"]
    for name, (module, text) in COMMANDS.items():
        if importlib.util.find_spec(module.rsplit(".", 1)[0]) is None:
            continue
        lines.append(f"  {name:<10} {text}")
    lines += ["", "NATS options on every command that connects: --nats URL[,URL...] --env ENV --creds FILE"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from gateway import __version__

        print(f"mavjet {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    entry = COMMANDS.get(name)
    if entry is None:
        print(f"mavjet: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(entry[0])
    except ModuleNotFoundError as exc:
        print(f"mavjet {name}: not available in this install ({exc.name} missing)", file=sys.stderr)
        return 2
    rc: int = module.main(rest)
    return rc


if __name__ == "__main__":
    sys.exit(main())
