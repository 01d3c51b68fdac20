"""Helpers shared by the analytics tests (fixtures live in conftest.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import nats

from gateway.natsserver import NatsServer
from sim.audit import AuditConfig, Truth, ensure_stream, publish

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
        nc = await nats.connect(url, connect_timeout=5)
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
