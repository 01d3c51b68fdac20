"""Analytics fixtures: one SparkSession for the whole run, and a published audit history.

Spark takes ~5 s to start, so `spark` is session-scoped (local[2]). The
`history` server is module-scoped: a real nats-server with the twin's
resources and a deterministic `mavjet synth` history whose ground truth the
tests compare job output with.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mavjet.analytics.synth import AuditConfig, Truth
from mavjet.ops.natsserver import NatsServer
from tests.analytics.support import ENV, HISTORY_END_NS, History, publish_history


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from mavjet.analytics.session import get_spark

    session = get_spark("local[2]", app_name="mavjet-tests")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[History]:
    d: Path = tmp_path_factory.mktemp("history")
    srv = NatsServer(store_dir=str(d / "js"), log_file=str(d / "nats.log"))
    srv.start()
    try:
        cfg = AuditConfig(vehicles=12, days=4, seed=7, env=ENV, end_ns=HISTORY_END_NS, failsafe_prob=0.3)
        truth = Truth(keep_detail=True)
        n = publish_history(srv.url, cfg, truth)
        yield History(server=srv, cfg=cfg, truth=truth, published=n)
    finally:
        srv.cleanup()
