"""`python -m tests.commands.gateway_proc ARGS`: `mavjet gateway ARGS` with the CommandService extension.

The same parser, config and shutdown as `gateway.daemon`, plus commands; the
SIGKILL test runs the gateway as a real process through this.
"""

from __future__ import annotations

import signal
import sys

import anyio

from gateway import logs
from gateway.commands.consumer import CommandService
from gateway.daemon import Gateway, build_parser, config_from_args


async def serve(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    logs.configure(args.log_level, json=args.log_json)
    gw = Gateway(config_from_args(args))
    gw.extensions.append(CommandService())

    async def on_signals() -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for sig in signals:
                gw.request_stop(signal.Signals(sig).name)
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(on_signals)
        await gw.run()
        tg.cancel_scope.cancel()
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(serve, sys.argv[1:]))
