"""`interpreted_only(module)`: a test that patches a module mypyc may have compiled (gateway/ops/compile.py).

A compiled module's classes take no new attributes and no interpreted
subclasses, and its functions call each other directly, so a monkeypatch
does not reach them. Such a test runs on the interpreted code and is skipped,
saying why, when the compiled copy's tests run (tests/ops/test_compile.py).
"""

from __future__ import annotations

import pytest

from gateway.ops.compile import compiled_modules


def interpreted_only(module: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(compiled_modules().get(module, False),
                              reason=f"patches {module}, which runs compiled here")
