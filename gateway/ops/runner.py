"""The shared shape of every operator subcommand's `main(argv)`.

Parse, run the coroutine, and turn the project's errors into one line on
stderr and exit code 2 (Ctrl-C exits 0): callers never see a traceback for a
bad argument or an unreachable server.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable

from gateway.contract.errors import MavjetError


def run_cli(
    parser: argparse.ArgumentParser, run: Callable[[argparse.Namespace], Awaitable[int]], argv: list[str]
) -> int:
    args = parser.parse_args(argv)
    try:
        return asyncio.run(run(args))  # type: ignore[arg-type]
    except MavjetError as exc:
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
