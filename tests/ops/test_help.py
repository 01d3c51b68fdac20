"""Every `mavjet` command, subcommand, option and argument says what it is for in `--help`.

Walks the one parser tree shell completion is generated from (ops/completion.py),
so a command registered as an entry point is checked with its flags, sub-subcommands and
the benchmarks under `mavjet bench`.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys

from mavjet.benchmarks.cli import BENCHMARKS
from mavjet.ops.cli import COMMANDS, GROUP
from mavjet.ops.completion import mavjet_parser


def _undocumented(parser: argparse.ArgumentParser, path: str) -> list[str]:
    out: list[str] = []
    for action in parser._actions:  # argparse has no public walk over its actions
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                if not helps.get(name):
                    out.append(f"{path} {name}")
                out += _undocumented(sub, f"{path} {name}")
            continue
        if not (action.help or "").strip():
            out.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    return out


def test_every_command_option_and_argument_has_help() -> None:
    parser = mavjet_parser()
    assert _undocumented(parser, "mavjet") == []
    # the walk reached into the benchmarks and into a command's subcommands
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    bench = next(a for a in sub.choices["bench"]._actions if isinstance(a, argparse._SubParsersAction))
    assert set(bench.choices) == set(BENCHMARKS)
    assert any("--new-compiled" in a.option_strings for a in bench.choices["ingest"]._actions)


def test_the_command_list_names_every_registered_command() -> None:
    registered = {ep.name for ep in importlib.metadata.entry_points(group=GROUP)}
    assert set(COMMANDS) == registered
    out = subprocess.run([sys.executable, "-m", "mavjet.ops", "--help"], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    listed = {line.split()[0] for line in out.splitlines() if line.startswith("  ")}
    assert listed == registered


def test_bench_help_lists_each_benchmark_with_what_it_measures() -> None:
    out = subprocess.run([sys.executable, "-m", "mavjet.ops", "bench", "--help"], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0 and out.stderr == ""
    rows = {line.split()[0]: line for line in out.stdout.splitlines() if line.startswith("  ")}
    assert set(rows) == set(BENCHMARKS)
    for name, (_, summary) in BENCHMARKS.items():
        assert summary in rows[name]
    bare = subprocess.run([sys.executable, "-m", "mavjet.ops", "bench"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert bare.returncode == 2 and "ingest" in bare.stderr and bare.stdout == ""
    bad = subprocess.run([sys.executable, "-m", "mavjet.ops", "bench", "ingset"], capture_output=True, text=True,
                         timeout=60, check=False)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "'ingset'" in bad.stderr and "ingest" in bad.stderr
