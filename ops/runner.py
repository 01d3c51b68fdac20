"""The shared shape of every operator subcommand's `main(argv)`.

Parse, run the command, and turn the project's errors into one line on
stderr and exit code 2: callers never see a traceback for a bad argument or
an unreachable server. Every subcommand's `main` is
`run_cli(build_parser(), run, argv)`; `run` may be a coroutine function or a
plain function (a command that manages processes rather than a connection).

Like a Unix tool: Ctrl-C exits 130 (128 + SIGINT), and a closed stdout (the
reader went away: `mavjet events --follow | head -2`) ends the command at
once with 0, even while it waits for something to print: a thread watches
stdout for the pipe's error condition and cancels the command.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import select
import stat
import sys
import threading
from collections.abc import Awaitable, Callable

import nats.errors
import nats.js.errors

from mavjet.contract.errors import ConfigError, MavjetError
from mavjet.contract.natsconn import check_url, with_scheme
from mavjet.contract.redact import redact
from mavjet.contract.units import parse_duration_s

EXIT_ERROR = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command stopped by Ctrl-C


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
        nats_servers(args, argv)
        result = run(args)
        if inspect.isawaitable(result):
            return asyncio.run(_wait(result))
        return result
    except reported as exc:
        print(redact(f"{parser.prog}: {exc}"), file=sys.stderr)  # the one line may quote a URL
        return EXIT_ERROR
    except nats.errors.Error as exc:
        # A command that did not check first (they do: ops/resolve.py): still one line, never a traceback.
        print(redact(f"{parser.prog}: {nats_error(exc, getattr(args, 'env', None))}"), file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except (BrokenPipeError, StdoutClosed):
        # The reader went away (`mavjet events | head`): that is how a pipe ends, not an
        # error. Point stdout at /dev/null so the interpreter's final flush stays quiet.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


def nats_servers(args: argparse.Namespace, argv: list[str]) -> None:
    """`--nats` as the nats CLI takes it: `host:port` (or `host`) means `nats://host:port`.

    Rewrites `args.nats` in place and checks each URL, naming the flag (or
    $MAVJET_NATS, where the default came from) rather than a config key.
    """
    value = getattr(args, "nats", None)
    if not isinstance(value, str):
        return
    given = any(a == "--nats" or a.startswith("--nats=") for a in argv)
    source = "--nats" if given or "MAVJET_NATS" not in os.environ else "$MAVJET_NATS"
    servers = [with_scheme(s.strip()) for s in value.split(",") if s.strip()]
    if not servers:
        raise _FlagError(f"{source}: empty; give a server URL like nats://127.0.0.1:4222")
    for url in servers:
        try:
            check_url(url)
        except ConfigError as exc:
            raise _FlagError(f"{source}: {exc.reason} (nats://HOST:PORT or HOST:PORT)") from None
    args.nats = ",".join(servers)


def nats_error(exc: Exception, env: object) -> str:
    """One line for an error NATS answered with."""
    if isinstance(exc, nats.js.errors.NotFoundError | nats.js.errors.BucketNotFoundError) and isinstance(env, str):
        return (f"a stream or bucket is missing ({type(exc).__name__}): is env {env!r} provisioned? "
                f"`mavjet provision --env {env}`")
    if isinstance(exc, nats.errors.NoRespondersError):
        return "no JetStream on this server (start nats-server with -js), or no permission for its API"
    if isinstance(exc, nats.errors.TimeoutError):
        return "NATS did not answer in time (a JetStream request timed out)"
    return f"{type(exc).__name__}: {exc}"


class _FlagError(MavjetError):
    """A connection flag's value is wrong: the message names the flag."""


class StdoutClosed(Exception):  # an ending, not an error: `run_cli` exits 0 on it
    """Stdout is a pipe whose reader went away."""


async def _wait(result: Awaitable[int]) -> int:
    """Await the command; end it early (StdoutClosed) when stdout's reader goes away first."""
    task = asyncio.ensure_future(result)
    closed = threading.Event()
    if _is_pipe(sys.stdout):
        loop = asyncio.get_running_loop()

        def on_closed() -> None:
            closed.set()
            task.cancel()

        threading.Thread(target=_watch_pipe, args=(sys.stdout.fileno(), lambda: loop.call_soon_threadsafe(on_closed)),
                         name="mavjet-stdout-watch", daemon=True).start()
    try:
        return await task
    except asyncio.CancelledError:
        if closed.is_set():
            raise StdoutClosed from None
        raise


def _is_pipe(stream: object) -> bool:
    try:
        fd = stream.fileno()  # type: ignore[attr-defined]
        return stat.S_ISFIFO(os.fstat(fd).st_mode)
    except (AttributeError, OSError, ValueError):  # replaced (pytest's capture), or closed
        return False


def _watch_pipe(fd: int, closed: Callable[[], None]) -> None:
    """Block until the pipe on `fd` has no reader (POLLERR on a write end), then call `closed`.

    A daemon thread: it never holds the process up, and the command's task is
    only cancelled through the loop (call_soon_threadsafe)."""
    poller = select.poll()
    poller.register(fd, select.POLLERR)  # POLLERR and POLLHUP are reported whatever is registered
    try:
        while True:
            for _, events in poller.poll():
                if events & (select.POLLERR | select.POLLHUP | select.POLLNVAL):
                    closed()
                    return
    except (OSError, ValueError, RuntimeError):  # the loop closed first: the command already ended
        return
