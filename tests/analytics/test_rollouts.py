"""analytics.rollouts: the audit trail of two rollouts (one done, one halted and rolled back) -> one row each."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from mavjet.analytics.columns import SCHEMA_DDL, Columns
from mavjet.analytics.rollouts import rollouts
from mavjet.contract.envelope import pack
from mavjet.contract.events import EventType
from mavjet.contract.subjects import event_subject, rollout_event_subject

E = EventType
T0_S = 1_764_900_000


def history() -> list[list[Any]]:
    """Rows as the JetStream source decodes them (analytics.columns), times as datetimes for Spark."""
    c = Columns()
    seq = 0

    def fleet(rid: str, etype: EventType, t_s: int, **data: Any) -> None:
        nonlocal seq
        seq += 1
        c.add("TWIN_EVENTS", seq, rollout_event_subject("test", rid, etype), pack(rid, t_s * 10**9, {"rollout": rid, **data}))

    def vehicle(rid: str, vid: str, t_s: int, result: str, failure: str | None = None) -> None:
        nonlocal seq
        seq += 1
        data = {"rollout": rid, "wave": 1, "result": result, "failure": failure, "detail": "", "desired_revision": 3}
        c.add("TWIN_EVENTS", seq, event_subject("test", vid, E.ROLLOUT_VEHICLE), pack(vid, t_s * 10**9, data))

    fleet("a", E.ROLLOUT_STARTED, T0_S, change={"params.RTL_ALT": 2000}, targets=2, waves=[1, 2], max_failures=0,
          selector="site=north")
    vehicle("a", "V1", T0_S + 2, "converged")
    fleet("a", E.ROLLOUT_WAVE, T0_S + 2, wave=1, waves=2, vehicles=1, converged=1, failed=0)
    vehicle("a", "V2", T0_S + 4, "converged")
    fleet("a", E.ROLLOUT_WAVE, T0_S + 4, wave=2, waves=2, vehicles=1, converged=1, failed=0)
    fleet("a", E.ROLLOUT_DONE, T0_S + 4, converged=2, failed=0, duration_s=4.0)
    fleet("b", E.ROLLOUT_STARTED, T0_S + 10, change={"rates.gps": 2}, targets=3, waves=[1, 3], max_failures=0,
          selector="V1,V2,V3")
    vehicle("b", "V1", T0_S + 11, "converged")
    vehicle("b", "V2", T0_S + 12, "failed", "armed")
    fleet("b", E.ROLLOUT_HALTED, T0_S + 12, wave=2, failed=1, reason="1 failures exceed --max-failures 0")
    vehicle("b", "V1", T0_S + 20, "rolled_back")
    fleet("b", E.ROLLOUT_ROLLED_BACK, T0_S + 20, restored=1, kept=0)
    rows = []
    for r in c.rows:
        assert r[4] is not None and r[7] is None  # the source names a rollout subject's type, and decodes it
        rows.append([*r[:5], dt.datetime.fromtimestamp(r[5] / 1e6, tz=dt.UTC), *r[6:]])
    return rows


def test_rollouts_one_row_each(spark: Any) -> None:
    out = {r["rollout"]: r.asDict() for r in rollouts(spark.createDataFrame(history(), SCHEMA_DDL)).collect()}
    a, b = out["a"], out["b"]
    assert (a["outcome"], a["targets"], a["waves"], a["waves_done"], a["converged"], a["failed"]) == (
        "done", 2, 2, 2, 2, 0)
    assert a["duration_s"] == 4.0 and json.loads(a["change"]) == {"params.RTL_ALT": 2000}
    assert (b["outcome"], b["converged"], b["failed"], b["failed_armed"], b["rolled_back"], b["waves_done"]) == (
        "rolled_back", 1, 1, 1, 1, 0)
    assert b["duration_s"] == 10.0
