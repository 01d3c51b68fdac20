"""Cold-start savings: the JVM class-data archive and workers importing pyspark from site-packages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mavjet.analytics.classcache import ENV_SWITCH, archive_options
from mavjet.analytics.pydaemon import _without_spark_zips
from mavjet.analytics.session import DAEMON_MODULE, spark_conf


def test_archive_options_record_then_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(ENV_SWITCH, raising=False)
    opts, tmp, final = archive_options("-Xfoo")
    assert tmp is not None and final is not None
    assert f"-XX:ArchiveClassesAtExit={tmp}" in opts and "-Xlog:cds=off" in opts
    assert tmp.parent == final.parent == tmp_path / "mavjet" / "jvm" and tmp != final
    final.write_bytes(b"x")
    opts, tmp2, final2 = archive_options("-Xfoo")
    assert opts.startswith(f"-XX:SharedArchiveFile={final} ") and tmp2 is None and final2 is None
    # other JVM options: another archive
    opts, tmp3, _ = archive_options("-Xbar")
    assert "ArchiveClassesAtExit" in opts and tmp3 is not None
    monkeypatch.setenv(ENV_SWITCH, "off")
    assert archive_options("-Xfoo") == ("", None, None)


def test_archive_options_without_a_usable_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_SWITCH, raising=False)
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    assert archive_options("") == ("", None, None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "with space"))
    assert archive_options("") == ("", None, None)


def test_daemon_path_drops_only_sparks_zips() -> None:
    path = ["/x/pyspark/python/lib/pyspark.zip", "/x/pyspark/python/lib/py4j-0.10.9.9-src.zip", "/w", "/v/site-packages"]
    assert _without_spark_zips(path) == ["/w", "/v/site-packages"]
    assert spark_conf("local[2]")["spark.python.daemon.module"] == DAEMON_MODULE


def test_workers_import_pyspark_from_site_packages(spark: Any) -> None:
    from pyspark.sql.functions import udf

    def where(_: int) -> str:
        import pyspark

        return pyspark.__file__ or ""

    files = {r[0] for r in spark.range(2).repartition(2).select(udf(where, "string")("id")).collect()}
    assert files and all(".zip" not in f and f.endswith("__init__.py") for f in files), files


_PROBE = """
import json, os, sys
from mavjet.analytics.session import get_spark
from pyspark import SparkContext
spark = get_spark("local[1]", app_name="mavjet-cds-test")
pid = SparkContext._gateway.proc.pid
with open(f"/proc/{pid}/maps", encoding="utf-8") as f:
    mapped = sorted({line.split()[-1] for line in f if line.rstrip().endswith(".jsa")})
print(json.dumps({"mapped": mapped, "rows": spark.range(3).count()}))
"""


@pytest.mark.timeout(300)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/maps")
def test_first_run_records_the_archive_and_the_next_maps_it(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    env.pop(ENV_SWITCH, None)
    jvm_dir = tmp_path / "mavjet" / "jvm"
    outs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", _PROBE], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, timeout=240, check=True)
        outs.append(json.loads(proc.stdout))  # stdout holds the JSON only: the JVM's CDS lines are off
        archives = sorted(p.name for p in jvm_dir.iterdir())
        assert len(archives) == 1 and archives[0].endswith(".jsa") and ".tmp." not in archives[0], archives
    assert [o["rows"] for o in outs] == [3, 3]
    assert not any(p.endswith(archives[0]) for p in outs[0]["mapped"])
    assert any(p.endswith(archives[0]) for p in outs[1]["mapped"]), outs[1]
