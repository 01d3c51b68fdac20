"""The shared shape of every operator subcommand's `main(argv)`.

Parse, run the command, and turn the project's errors into one line on
stderr and exit code 2 (Ctrl-C exits 0): callers never see a traceback for a
bad argument or an unreachable server. Every subcommand's `main` is
`run_cli(build_parser(), run, argv)`; `run` may be a coroutine function or a
plain function (a command that manages processes rather than a connection).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import sys
from collections.abc import Awaitable, Callable

from mavjet.contract.errors import MavjetError
from mavjet.contract.redact import redact
from mavjet.contract.units import parse_duration_s

EXIT_ERROR = 2


def duration(text: str) -> float:
    """argparse type for every duration flag: `30s`, `5m`, `1h`, `250ms`, or plain seconds."""
    try:
        return parse_duration_s(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def run_cli(
    parser: argparse.ArgumentParser,
    run: Callable[[argparse.Namespace], Awaitable[int] | int],
    argv: list[str],
    *,
    errors: tuple[type[Exception], ...] = (),
) -> int:
    """`errors` adds exception types (e.g. OSError for a command reading files) reported like MavjetError."""
    args = parser.parse_args(argv)
    reported: tuple[type[Exception], ...] = (MavjetError, *errors)
    try:
        result = run(args)
        if inspect.isawaitable(result):
            return asyncio.run(_wait(result))
        return result
    except reported as exc:
        print(redact(f"{parser.prog}: {exc}"), file=sys.stderr)  # the one line may quote a URL
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:
        # The reader went away (`mavjet events | head`): that is how a pipe ends, not an
        # error. Point stdout at /dev/null so the interpreter's final flush stays quiet.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


async def _wait(result: Awaitable[int]) -> int:
    return await result
