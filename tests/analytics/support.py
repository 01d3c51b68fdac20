"""Helpers shared by the analytics tests (fixtures live in conftest.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from mavjet.analytics.synth import AuditConfig, Truth, publish
from mavjet.contract.natsconn import open_client
from mavjet.ops.natsserver import NatsServer
from mavjet.ops.synth import ensure_stream

ENV = "test"
# 2025-06-15T00:00:00Z: fixed, so the history is the same on every run.
HISTORY_END_NS = 1_749_945_600 * 10**9


@dataclass
class History:
    server: NatsServer
    cfg: AuditConfig
    truth: Truth
    published: int

    @property
    def url(self) -> str:
        return self.server.url


def publish_history(url: str, cfg: AuditConfig, truth: Truth, *, max_events: int | None = None) -> int:
    async def go() -> int:
        nc = await open_client(url, connect_timeout=5)
        try:
            await ensure_stream(nc, cfg.env)
            return await publish(nc.jetstream(), cfg, truth, max_events=max_events)
        finally:
            await nc.close()

    return asyncio.run(go())


def read(spark: Any, url: str, **options: Any) -> Any:
    r = spark.read.format("jetstream").option("url", url)
    for k, v in options.items():
        r = r.option(k, str(v))
    return r.load()


def parquet_rows(spark: Any, path: str, order: list[str]) -> list[tuple[Any, ...]]:
    """A Parquet output as sorted plain tuples (floats rounded), for run-to-run comparison."""
    df = spark.read.parquet(path).orderBy(*order)
    return [tuple(round(v, 6) if isinstance(v, float) else v for v in r) for r in df.collect()]


@dataclass
class Standalone:
    """A Spark standalone master + one worker from the pyspark installation, on loopback."""

    master_url: str
    procs: list[Any]

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except Exception:
                p.kill()
                p.wait(timeout=10)


def start_standalone(work_dir: str, *, cores: int = 2, timeout_s: float = 60.0) -> Standalone:
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    import pyspark

    from mavjet.ops.natsserver import free_port, wait_port

    home = Path(pyspark.__file__).resolve().parent
    spark_class = str(home / "bin" / "spark-class")
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOG_DIR": work_dir,
        "SPARK_WORKER_DIR": work_dir,
    }
    port, ui = free_port(), free_port()
    procs: list[Any] = []
    with open(Path(work_dir) / "master.log", "ab") as log:
        procs.append(
            subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                 "--webui-port", str(ui)],
                env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
            )
        )
    cluster = Standalone(master_url=f"spark://127.0.0.1:{port}", procs=procs)
    try:
        if not wait_port("127.0.0.1", port, timeout_s):
            raise RuntimeError("spark master did not listen")
        with open(Path(work_dir) / "worker.log", "ab") as wlog:
            procs.append(
                subprocess.Popen(
                    [spark_class, "org.apache.spark.deploy.worker.Worker", cluster.master_url, "--host", "127.0.0.1",
                     "--port", str(free_port()), "--webui-port", str(free_port()), "--cores", str(cores),
                     "--memory", "2g", "--work-dir", work_dir],
                    env=env, stdout=wlog, stderr=wlog, stdin=subprocess.DEVNULL,
                )
            )
        deadline = time.monotonic() + timeout_s
        worker_log = Path(work_dir) / "worker.log"
        while time.monotonic() < deadline:
            if b"Successfully registered with master" in worker_log.read_bytes():
                return cluster
            if any(p.poll() is not None for p in procs):
                raise RuntimeError("spark master or worker exited; see the logs in " + work_dir)
            time.sleep(0.3)
        raise RuntimeError("spark worker did not register with the master")
    except BaseException:
        cluster.stop()
        raise
