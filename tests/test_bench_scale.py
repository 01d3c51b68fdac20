"""`mavjet bench scale`: both consumer shapes serve every command, before and after a restart; and the grouping."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio

from mavjet.drivers.mavlink.transport import Endpoint
from mavjet.gateway.commands.intake import MAX_FILTERS, gateway_intakes
from mavjet.gateway.commands.keepalive import KeepAlives
from mavjet.gateway.commands.lane import VehicleLane
from mavjet.gateway.config import GatewayConfig, VehicleConfig
from mavjet.gateway.runtime.metrics import GatewayMetrics
from mavjet.gateway.services import ServiceContext


def test_scale_bench_runs_both_shapes_and_counts_their_consumers(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    proc = subprocess.run([sys.executable, "-m", "mavjet.ops", "bench", "scale", "--counts", "3,12", "--rounds", "1",
                           "--commands", "30", "--rate", "200", "--json", str(out)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    summary = res["summary"]
    assert summary["vehicle/12"]["consumers"] == 12 and summary["gateway/12"]["consumers"] == 1
    for key in ("vehicle/3", "gateway/3", "vehicle/12", "gateway/12"):
        assert summary[key]["results"] == "30/30", (key, summary[key])
        assert summary[key]["p99_ms"] > 0 and summary[key]["rebind_s"] is not None
    for rows in res["trials"].values():
        assert all(r["served_after_restart"] == "30/30" for r in rows), rows
    assert any(k.startswith("gateway p99 at 12") for k in res["goals"])


class _Quiet:
    def __init__(self, vid: str) -> None:
        self.vid = vid

    def may_act(self) -> bool:
        return True


def test_a_large_gateway_splits_its_vehicles_over_consumers_of_at_most_max_filters() -> None:
    cfg = GatewayConfig(vehicles=(VehicleConfig(vid="V", endpoint=Endpoint.parse("udp:127.0.0.1:14550")),), env="t")
    ctx = ServiceContext(cfg=cfg, vehicles={}, nats=None, metrics=GatewayMetrics())  # type: ignore[arg-type]
    keep = KeepAlives(1.0)
    n = 2 * MAX_FILTERS + 7
    lanes = {f"V{i:05d}": VehicleLane(_Quiet(f"V{i:05d}"), None, keep, max_queued=4)  # type: ignore[arg-type]
             for i in range(n)}
    intakes = gateway_intakes(ctx, lanes, base_name="gwx_t", api=anyio.CapacityLimiter(1), max_ack_pending=1000)
    assert [len(i.vids) for i in intakes] == [MAX_FILTERS, MAX_FILTERS, 7]
    assert [i.name for i in intakes] == ["gwx_t_0", "gwx_t_1", "gwx_t_2"]
    assert sorted(v for i in intakes for v in i.vids) == sorted(lanes)  # each vehicle in exactly one
    assert all(i.max_ack_pending == 334 for i in intakes)  # the budget shared out, rounded up
