"""Every duration flag takes the same forms (`30s`, `5m`, `250ms`, plain seconds) and refuses others in one line."""

from __future__ import annotations

import argparse

import pytest

from mavjet.ops import backup, migrate, restore, shadow, sign
from mavjet.ops.runner import duration


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30.0), ("5m", 300.0), ("250ms", 0.25), ("12", 12.0), ("1h", 3600.0)])
def test_duration_forms(text: str, seconds: float) -> None:
    assert duration(text) == seconds


def test_a_bad_duration_is_an_argparse_error_naming_the_forms() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="duration like"):
        duration("soon")


@pytest.mark.parametrize(
    ("parser", "argv", "attr", "seconds"),
    [
        (backup.build_parser, ["--out", "x", "--timeout", "2m"], "timeout", 120.0),
        (restore.build_parser, ["x", "--timeout", "30s"], "timeout", 30.0),
        (migrate.build_parser, ["status", "--from", "nats://127.0.0.1:1", "--wait", "90s"], "wait", 90.0),
        (sign.build_parser, ["setup", "VID-001", "--timeout", "15s"], "timeout", 15.0),
        (shadow.build_parser, ["watch", "VID-001", "--timeout", "1m"], "timeout", 60.0),
    ],
)
def test_commands_take_durations(parser: object, argv: list[str], attr: str, seconds: float) -> None:
    args = parser().parse_args(argv)  # type: ignore[operator]
    assert getattr(args, attr) == seconds
