"""The simulator process's ready line: how many of its modules run compiled, and how a parent reads it.

`mavjet sim` ends its start-up with `ready vehicles=N compiled=K`
(`mavjet.sim.cli`); `mavjet sim bench` and the benchmarks read K back. Its
own module, without MAVLink or asyncio, so that the reader does not import
the simulator's command line (which imports the bench: a cycle).
"""

from __future__ import annotations

import sys
from importlib.machinery import EXTENSION_SUFFIXES


def compiled_modules() -> int:
    """How many of the simulator's imported modules are C extensions (a compiled tick path)."""
    suffixes = tuple(EXTENSION_SUFFIXES)
    return sum(1 for name, mod in list(sys.modules.items())
               if name.startswith("mavjet.sim.") and str(getattr(mod, "__file__", "")).endswith(suffixes))


def compiled_from_ready(line: str) -> int:
    """`ready vehicles=N compiled=K` (the line `run` prints) -> K; 0 when it names none (interpreted)."""
    fields = dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
    try:
        return int(fields.get("compiled", "0"))
    except ValueError:
        return 0
