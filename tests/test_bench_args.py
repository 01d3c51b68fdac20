"""The benchmarks refuse a bad figure before anything starts: one usage error, exit 2.

A zero or negative fleet size, duration or count used to reach a nats-server or the
simulator half-way up and end in a traceback (`bench ingest --vehicles 0`,
`bench consumers --counts x`)."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from mavjet.benchmarks import kit
from mavjet.benchmarks.cli import BENCHMARKS


def test_number_types() -> None:
    assert kit.positive_int("3") == 3 and kit.non_negative_int("0") == 0
    assert kit.positive_float("0.5") == 0.5 and kit.non_negative_float("0") == 0.0
    assert kit.positive_ints(" 1000, 5000 ,") == [1000, 5000]
    for fn, text, words in [(kit.positive_int, "0", "> 0"), (kit.positive_int, "1.5", "not an integer"),
                            (kit.non_negative_int, "-1", ">= 0"), (kit.positive_float, "-0.1", "> 0"),
                            (kit.positive_float, "inf", "> 0"), (kit.non_negative_float, "nan", ">= 0"),
                            (kit.positive_float, "ten", "not a number"), (kit.positive_ints, ",", "expected counts"),
                            (kit.positive_ints, "5,0", "> 0")]:
        with pytest.raises(argparse.ArgumentTypeError, match=words):
            fn(text)


def _checked_options() -> list[tuple[str, str, str]]:
    """(benchmark, option, a value its type refuses) for every option typed by mavjet.benchmarks.kit."""
    refused: dict[object, str] = {kit.positive_int: "0", kit.positive_float: "0", kit.non_negative_int: "-1",
                                  kit.non_negative_float: "-1", kit.positive_ints: "0"}
    out: list[tuple[str, str, str]] = []
    for name, (module, _) in BENCHMARKS.items():
        parser = importlib.import_module(module).build_parser()
        # argparse has no public walk over its actions
        out.extend((name, a.option_strings[0], refused[a.type]) for a in parser._actions
                   if a.type in refused and a.option_strings)
    return out


CHECKED = _checked_options()


def test_the_fleet_sizes_and_durations_are_checked() -> None:
    names = {(name, opt) for name, opt, _ in CHECKED}
    for pair in [("ingest", "--vehicles"), ("ingest", "--duration"), ("mixed", "--cmd-rate"),
                 ("consumers", "--counts"), ("compare", "--rounds"), ("uplink", "--rate-bps")]:
        assert pair in names, pair


@pytest.mark.parametrize(("name", "option", "value"), CHECKED, ids=[f"{n}{o}" for n, o, _ in CHECKED])
def test_a_bad_figure_is_a_usage_error(name: str, option: str, value: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    parser = importlib.import_module(BENCHMARKS[name][0]).build_parser()
    with pytest.raises(SystemExit) as exc:
        parser.parse_args([option, value, "REF"] if name == "compare" else [option, value])
    assert exc.value.code == 2
    assert f"argument {option}" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "last_line"), [
    (["bench", "ingest", "--vehicles", "0"], "mavjet bench ingest: error: argument --vehicles: '0': must be > 0"),
    (["sim", "bench", "-n", "0"], "mavjet sim bench: error: --vehicles must be >= 1, --duration > 0 and --warmup >= 0"),
    (["demo", "--speedup", "0", "--dir", "{tmp}"], "mavjet demo: config --speedup: must be in (0, 1000], got 0.0"),
    (["bench", "uplink", "--cmd-rate", "2", "--failsafe-rate", "1"],
     "mavjet bench uplink: --cmd-rate must be at most --failsafe-rate"),
    (["bench", "overload", "--sizes", "500,x"], "mavjet bench overload: error: argument --sizes: 'x' is not an integer"),
])
def test_from_the_command_line(argv: list[str], last_line: str, tmp_path: Path) -> None:
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    proc = subprocess.run([sys.executable, "-m", "mavjet.ops", *argv], capture_output=True, text=True, timeout=60,
                          check=False, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.splitlines()[-1] == last_line
    assert list(tmp_path.iterdir()) == []  # refused before anything was started or written
