"""A JVM class-data archive (AppCDS) for the Spark driver, kept in the user's cache.

Loading and verifying Spark's ~30k classes is most of the JVM's share of a cold
`mavjet replay` start. The first run records the classes it loaded
(`-XX:ArchiveClassesAtExit`, JDK 13+) into a temporary file that is renamed into
place only after its JVM has exited, so a reader never maps a half-written
archive; later runs map it (`-XX:SharedArchiveFile`). Nothing here may break a
replay: no writable cache dir, an archive the JVM rejects (`-Xshare:auto` falls
back to loading classes normally) or a dump that fails all just cost the saving.
The JVM's CDS log lines are switched off because they go to stdout, which
carries the replay's JSON summary.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import time
from pathlib import Path
from typing import Any

ENV_SWITCH = "MAVJET_JVM_CLASS_CACHE"  # "off" disables the archive
_QUIET = "-Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off"
_STALE_TMP_S = 24 * 3600.0  # a temporary archive this old belongs to a run that died


def cache_dir() -> Path | None:
    """The per-user directory for archives, created owner-only; None when unusable."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    d = Path(base) / "mavjet" / "jvm"
    try:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError:
        return None
    return d if os.access(d, os.W_OK | os.X_OK) else None


def archive_key(jvm_options: str) -> str:
    """What the archive depends on: Spark's jars, the java binary, the JVM options.

    The JVM validates the class path itself; the key only avoids a rejected
    archive shadowing a usable one after an upgrade."""
    import pyspark

    home = os.environ.get("JAVA_HOME")
    java = os.path.realpath(os.path.join(home, "bin", "java") if home else shutil.which("java") or "java")
    parts = [pyspark.__version__, os.path.dirname(os.path.abspath(pyspark.__file__)), jvm_options, java]
    try:
        st = os.stat(java)
        parts += [str(st.st_mtime_ns), str(st.st_size)]
    except OSError:
        pass
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _drop_stale(d: Path) -> None:
    now = time.time()
    for p in d.glob("*.tmp.jsa"):
        try:
            if now - p.stat().st_mtime > _STALE_TMP_S:
                p.unlink()
        except OSError:
            pass


def archive_options(jvm_options: str) -> tuple[str, Path | None, Path | None]:
    """JVM options that use (or record) the archive, plus (temporary, final) paths
    when this run records it; ("", None, None) when switched off or unusable."""
    if os.environ.get(ENV_SWITCH, "").lower() in {"off", "0", "false", "no"}:
        return "", None, None
    d = cache_dir()
    if d is None or any(c.isspace() for c in str(d)):  # Spark splits extraJavaOptions on whitespace
        return "", None, None
    _drop_stale(d)
    final = d / f"spark-{archive_key(jvm_options)}.jsa"
    try:
        if final.stat().st_size > 0:
            return f"-XX:SharedArchiveFile={final} {_QUIET}", None, None
    except OSError:
        pass
    tmp = d / f"spark-{archive_key(jvm_options)}.{os.getpid()}.tmp.jsa"
    return f"-XX:ArchiveClassesAtExit={tmp} {_QUIET}", tmp, final


def publish_at_exit(spark: Any, tmp: Path, final: Path) -> None:
    """At interpreter exit, stop the JVM, wait for its dump, and rename it into place."""

    def finish() -> None:
        try:
            spark.stop()
            proc = jvm_process()
            if proc is not None and proc.stdin is not None:
                proc.stdin.close()  # the JVM exits on EOF and writes the archive as it goes
                proc.wait(timeout=120)
            if tmp.stat().st_size > 0:
                os.replace(tmp, final)
        except Exception:  # a failed dump only costs the saving
            pass
        finally:
            try:
                tmp.unlink()
            except OSError:
                pass

    atexit.register(finish)


# pyspark keeps the JVM it started (its py4j gateway and that gateway's process) only in
# `SparkContext._gateway`, with no public way to it: these two read it, and this module is the one
# that may (pyproject.toml's per-file-ignores).


def jvm_started() -> bool:
    """Whether this process has started pyspark's JVM already (JVM options then no longer count)."""
    from pyspark import SparkContext

    return SparkContext._gateway is not None


def jvm_process() -> Any:
    """The JVM process pyspark started (a `subprocess.Popen`), or None."""
    from pyspark import SparkContext

    return getattr(SparkContext._gateway, "proc", None)
