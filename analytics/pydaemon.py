"""The PySpark worker daemon, importing pyspark from site-packages.

Spark puts its `python/lib/pyspark.zip` first on every worker's PYTHONPATH.
Python never caches bytecode for a zip without .pyc files, so each daemon
compiled pyspark's modules again (~0.7 s of CPU per daemon start, measured;
~17% of a replay's worker samples). The installed package is the same
version, with its bytecode cached, so the zips are dropped from the path before
pyspark is imported. Run by Spark as `python -m mavjet.analytics.pydaemon <worker module>`
(`spark.python.daemon.module`).
"""

from __future__ import annotations

import sys


def _without_spark_zips(path: list[str]) -> list[str]:
    """`path` minus Spark's bundled pyspark and py4j zips (only when installed copies exist)."""
    return [p for p in path if not (p.endswith(".zip") and ("pyspark.zip" in p or "py4j-" in p))]


if __name__ == "__main__":
    import importlib.util

    kept = _without_spark_zips(sys.path)
    saved = sys.path[:]
    sys.path[:] = kept
    if importlib.util.find_spec("pyspark") is None or importlib.util.find_spec("py4j") is None:
        sys.path[:] = saved  # no installed copy: the zips are all there is
    from pyspark import daemon

    daemon.manager()
