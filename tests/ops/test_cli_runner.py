"""Every operator subcommand runs through `mavjet.ops.runner.run_cli`: one-line errors (exit 2), Ctrl-C exits 130."""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import tomllib
from pathlib import Path

import pytest

from mavjet.contract.errors import ConfigError
from mavjet.ops.runner import run_cli

ROOT = Path(__file__).resolve().parents[2]


def operator_commands() -> dict[str, str]:
    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["mavjet.commands"]
    return {name: target for name, target in eps.items() if target.startswith("mavjet.ops.")}


@pytest.mark.parametrize("name", sorted(operator_commands()))
def test_every_operator_command_uses_run_cli(name: str) -> None:
    module, _, func = operator_commands()[name].partition(":")
    main = getattr(importlib.import_module(module), func)
    calls = {n.func.id for n in ast.walk(ast.parse(inspect.getsource(main)))
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert "run_cli" in calls, f"mavjet {name}: main() bypasses run_cli"


def test_run_cli_reports_errors_in_one_line_and_ctrl_c_exits_130(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="mavjet t")

    async def bad(_: argparse.Namespace) -> int:
        raise ConfigError("--x", "nope")

    def interrupted(_: argparse.Namespace) -> int:
        raise KeyboardInterrupt

    async def ok(_: argparse.Namespace) -> int:
        return 0

    def io(_: argparse.Namespace) -> int:
        raise OSError("disk on fire")

    assert run_cli(parser, bad, []) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("mavjet t: ") and "--x" in err
    assert run_cli(parser, interrupted, []) == 130
    assert run_cli(parser, ok, []) == 0
    assert run_cli(parser, io, [], errors=(OSError,)) == 2
    assert "disk on fire" in capsys.readouterr().err
    with pytest.raises(OSError):
        run_cli(parser, io, [])
