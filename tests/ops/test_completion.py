"""`mavjet completion`: the generated bash script parses and completes subcommands, their subcommands and flags.

Run in a real bash: the script is sourced and its completion function called
the way bash calls it on <Tab> (COMP_WORDS/COMP_CWORD), and COMPREPLY read back.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="bash is not installed")


def mavjet(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mavjet.ops", *argv], capture_output=True, text=True,
                          timeout=120, check=False)


@pytest.fixture(scope="module")
def bash_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = mavjet("completion", "bash")
    assert out.returncode == 0, out.stderr
    path = tmp_path_factory.mktemp("completion") / "mavjet.bash"
    path.write_text(out.stdout, encoding="utf-8")
    return path


def complete(script: Path, line: str) -> list[str]:
    """What <Tab> at the end of `line` offers, from the sourced script's own function."""
    words = line.split(" ")
    prog = (
        f"source {script}\n"
        f"COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
        f"COMP_LINE={line!r}; COMP_POINT=${{#COMP_LINE}}\n"
        'fn=$(complete -p mavjet | sed -E "s/.* -F ([^ ]+) .*/\\1/")\n'
        '"$fn" mavjet "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"\n'
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    out = subprocess.run([str(BASH), "--norc", "--noprofile", "-c", prog], capture_output=True, text=True,
                         timeout=30, check=False)
    assert out.returncode == 0, out.stderr
    return [w for w in out.stdout.split("\n") if w]


def test_script_is_valid_bash(bash_script: Path) -> None:
    out = subprocess.run([str(BASH), "-n", str(bash_script)], capture_output=True, text=True, timeout=30,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert "complete " in bash_script.read_text() and "mavjet" in bash_script.read_text()


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("mavjet bl", ["blobs"]),
        ("mavjet s", ["shadow", "sign", "sim", "synth"]),
        ("mavjet shadow ", ["diff", "edit", "get", "history", "set", "watch"]),
        ("mavjet blobs get --re", ["--retries"]),
        ("mavjet twin VID-001 --js", ["--json"]),
        ("mavjet completion ", ["bash", "tcsh", "zsh"]),
        ("mavjet bench co", ["commands", "compare", "consumers"]),
        ("mavjet bench ingest --new-c", ["--new-compiled"]),
    ],
)
def test_tab_completes_commands_subcommands_and_flags(bash_script: Path, line: str, expected: list[str]) -> None:
    assert sorted(complete(bash_script, line)) == expected


def test_every_registered_command_is_completed(bash_script: Path) -> None:
    import importlib.metadata

    names = {ep.name for ep in importlib.metadata.entry_points(group="mavjet.commands")}
    offered = set(complete(bash_script, "mavjet "))
    assert names <= offered and "completion" in offered


def test_zsh_script_and_bad_shell() -> None:
    out = mavjet("completion", "zsh")
    assert out.returncode == 0 and out.stdout.startswith("#compdef mavjet"), out.stderr[-500:]
    assert "blobs" in out.stdout and "--retries" in out.stdout
    zsh = shutil.which("zsh")
    if zsh is not None:
        check = subprocess.run([zsh, "-n"], input=out.stdout, capture_output=True, text=True, timeout=30, check=False)
        assert check.returncode == 0, check.stderr
    bad = mavjet("completion", "fish")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
