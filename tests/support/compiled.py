"""Tests around the compiled hot path (ops/compile.py).

`interpreted_only(module)`: a test that patches a module mypyc may have compiled.

A compiled module's classes take no new attributes and no interpreted
subclasses, and its functions call each other directly, so a monkeypatch
does not reach them. Such a test runs on the interpreted code and is skipped,
saying why, when the compiled copy's tests run (tests/ops/test_compile.py).
"""

from __future__ import annotations

import importlib.util
import shutil
import sysconfig
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest


def runs_compiled(module: str) -> bool:
    """Whether this interpreter imports `module` as a C extension (a hot or a simulator module)."""
    spec = importlib.util.find_spec(module)
    return spec is not None and str(spec.origin or "").endswith(tuple(EXTENSION_SUFFIXES))


def interpreted_only(module: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(runs_compiled(module), reason=f"patches {module}, which runs compiled here")


def cannot_compile() -> str | None:
    """None when this machine can build C extensions (`mavjet compile`); else why not."""
    if shutil.which(str(sysconfig.get_config_var("CC") or "cc").split()[0]) is None:
        return "no C compiler"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        return "no Python headers (Python.h)"
    return None
