"""The 3-node cluster fixtures of tests/deploy, for the lease's cluster tests."""

from __future__ import annotations

from tests.deploy.conftest import cluster_nc, nats_cluster

__all__ = ["cluster_nc", "nats_cluster"]
