"""Building the SparkSession the jobs run in: loopback-bound, UI off, source registered.

Starting Spark takes 7-20 s on a shared 2-core machine, so one session is built per
process and shared by every job. The same code runs on `local[*]` and on a
standalone cluster (`spark://host:7077`): the only difference is `master`.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

from mavjet.contract.errors import ConfigError

LOOPBACK = "127.0.0.1"
# On local[*] the executors live in the driver JVM, so this heap holds the
# cached events and every task's working set. Spark's own default (1g) runs
# out of heap caching ~10M events; -Xmx only caps the heap, it reserves nothing.
DEFAULT_DRIVER_MEMORY = "4g"
# C1 only: on a 2-core laptop the C2 JIT compiler threads were the largest
# CPU consumer of a replay (35 of 75 JVM CPU-seconds at 200k events), while
# the jobs run too briefly for C2's faster code to pay that back (at 1M
# events too: 106 instead of 81 JVM CPU-seconds with C2). The parallel
# collector instead of G1: 74 instead of 80 JVM CPU-seconds at 1M events
# (no concurrent marking threads; a batch job does not mind its pauses).
DEFAULT_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseParallelGC"
# Workers import pyspark from site-packages (bytecode cached), not Spark's zip.
DAEMON_MODULE = "mavjet.analytics.pydaemon"
_MEMORY = re.compile(r"[1-9][0-9]*[kmgt]", re.IGNORECASE)


def check_memory(key: str, value: str) -> str:
    """A JVM memory size as Spark takes it (`512m`, `4g`); raise ConfigError naming `key` otherwise."""
    if not _MEMORY.fullmatch(value.strip()):
        raise ConfigError(key, f"{value!r} is not a memory size like 512m or 4g")
    return value.strip().lower()


def spark_conf(
    master: str,
    *,
    bind_host: str = LOOPBACK,
    shuffle_partitions: int = 8,
    driver_memory: str = DEFAULT_DRIVER_MEMORY,
    jvm_options: str = DEFAULT_JVM_OPTIONS,
) -> dict[str, str]:
    """The configuration the jobs need. Pure, so it can be checked without Spark.

    `spark.driver.memory` only takes effect when this process starts the JVM
    (the first session); a session that already exists keeps its heap. So do
    `jvm_options` (`spark.driver.extraJavaOptions`).
    """
    return {
        "spark.master": master,
        "spark.driver.memory": check_memory("driver_memory", driver_memory),
        "spark.driver.extraJavaOptions": jvm_options,
        "spark.driver.host": bind_host,
        "spark.driver.bindAddress": bind_host,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.sql.adaptive.enabled": "true",
        # Workers run the data source; they must use the same interpreter
        # (and therefore the same installed packages) as the driver.
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
        "spark.executorEnv.SPARK_LOCAL_IP": bind_host,
        "spark.python.daemon.module": DAEMON_MODULE,
    }


def get_spark(
    master: str = "local[*]",
    *,
    app_name: str = "mavjet-replay",
    bind_host: str = LOOPBACK,
    driver_memory: str = DEFAULT_DRIVER_MEMORY,
    extra_conf: dict[str, str] | None = None,
) -> Any:
    """Get or create the process's SparkSession with the `jetstream` source registered."""
    os.environ.setdefault("SPARK_LOCAL_IP", bind_host)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from mavjet.analytics.classcache import archive_options, jvm_started, publish_at_exit
    from mavjet.analytics.source import register

    builder = SparkSession.builder.appName(app_name)
    jvm_options, archive_tmp, archive_final = DEFAULT_JVM_OPTIONS, None, None
    if not jvm_started():  # JVM options only count when this process starts the JVM
        cds, archive_tmp, archive_final = archive_options(DEFAULT_JVM_OPTIONS)
        jvm_options = f"{DEFAULT_JVM_OPTIONS} {cds}".strip()
    conf = spark_conf(master, bind_host=bind_host, driver_memory=driver_memory, jvm_options=jvm_options)
    conf.update(extra_conf or {})
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    if archive_tmp is not None and archive_final is not None:
        publish_at_exit(spark, archive_tmp, archive_final)
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
