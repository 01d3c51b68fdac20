from __future__ import annotations

import subprocess
import sys

import pytest
from nats.aio.client import Client
from nats.js import api as jsapi
from nats.js.errors import APIError

from mavjet.ops.natsserver import NatsServer
from mavjet.ops.provision import (
    DEFINITIONS_DIR,
    ProvisionConflict,
    load_definitions,
    plan_stream,
    provision,
)


def test_definitions_follow_the_contract() -> None:
    defs = {d.name: d for d in load_definitions(DEFINITIONS_DIR, env="prod", replicas=3)}
    assert set(defs) == {"TWIN_STATE", "TWIN_EVENTS", "TWIN_CMD", "TWIN_SHADOW", "TWIN_BLOBS", "TWIN_LOGS", "TWIN_TRACKS",
                         "TWIN_LEASES", "TWIN_ROLLOUTS"}
    st = defs["TWIN_STATE"].config
    assert st.subjects == ["fleet.prod.veh.*.state.>"]
    assert st.max_age == 3600 and st.allow_rollup_hdrs and st.num_replicas == 3
    ev = defs["TWIN_EVENTS"].config
    assert ev.max_age == 90 * 86400 and ev.max_bytes == 100 * 1024**3
    assert ev.duplicate_window is not None and ev.duplicate_window >= 120
    assert defs["TWIN_CMD"].config.retention == jsapi.RetentionPolicy.WORK_QUEUE
    assert defs["TWIN_SHADOW"].config.max_msgs_per_subject == 5
    assert defs["TWIN_SHADOW"].config.allow_direct
    assert defs["TWIN_BLOBS"].chunk_size_bytes == 128 * 1024
    # One lease per vehicle (docs/ownership.md): replicated like the rest, newest only, read from the leader.
    leases = defs["TWIN_LEASES"].config
    assert leases.name == "KV_TWIN_LEASES" and leases.subjects == ["$KV.TWIN_LEASES.>"] and leases.num_replicas == 3
    # direct gets name the key, so a vehicle's credential reads only its own (docs/ownership.md)
    assert leases.max_msgs_per_subject == 1 and leases.allow_direct and leases.max_age == 900
    logs = defs["TWIN_LOGS"].config  # under each vehicle's own subjects, so its credential can be scoped to them
    assert logs.subjects == ["fleet.prod.veh.*.logs.>"] and logs.allow_direct and logs.allow_rollup_hdrs
    assert logs.discard == jsapi.DiscardPolicy.NEW  # full: a new log is refused, never an old one's chunks dropped


def test_bad_env_is_rejected() -> None:
    with pytest.raises(Exception, match="subject token"):
        load_definitions(DEFINITIONS_DIR, env="pr.od", replicas=1)


def test_plan_detects_conflict_and_drift() -> None:
    wanted = jsapi.StreamConfig(name="X", subjects=["a.>"], retention=jsapi.RetentionPolicy.LIMITS, max_age=3600)
    live = jsapi.StreamConfig(name="X", subjects=["a.>"], retention=jsapi.RetentionPolicy.WORK_QUEUE)
    with pytest.raises(ProvisionConflict) as ei:
        plan_stream("stream X", live, wanted)
    assert ei.value.field_name == "retention"
    live2 = jsapi.StreamConfig(name="X", subjects=["a.>"], retention=jsapi.RetentionPolicy.LIMITS, max_age=60)
    action = plan_stream("stream X", live2, wanted)
    assert action.verb == "update" and action.changes == {"max_age": (60.0, 3600.0)}


async def test_provision_is_idempotent_and_fixes_drift(nc: Client) -> None:
    js = nc.jetstream()
    defs = load_definitions(DEFINITIONS_DIR, env="test", replicas=1)
    first = await provision(js, defs)
    assert {a.verb for a in first} == {"create"}
    second = await provision(js, defs)
    assert {a.verb for a in second} == {"unchanged"}
    # Someone shortens TWIN_EVENTS retention by hand: provisioning puts it back.
    info = await js.stream_info("TWIN_EVENTS")
    cfg = info.config
    cfg.max_age = 3600.0
    await js.update_stream(cfg)
    dry = await provision(js, defs, dry_run=True)
    ev = next(a for a in dry if a.resource == "stream TWIN_EVENTS")
    assert ev.verb == "update" and "max_age" in ev.changes
    assert (await js.stream_info("TWIN_EVENTS")).config.max_age == 3600.0  # dry run changed nothing
    await provision(js, defs)
    assert (await js.stream_info("TWIN_EVENTS")).config.max_age == 90 * 86400
    kv = await js.key_value("TWIN_SHADOW")
    await kv.put("fleet.test.veh.VID-001.desired", b"{}")
    assert (await kv.get("fleet.test.veh.VID-001.desired")).value == b"{}"


async def test_conflicting_stream_fails_with_clear_message(nc: Client) -> None:
    js = nc.jetstream()
    await js.add_stream(jsapi.StreamConfig(name="TWIN_CMD", subjects=["fleet.test.veh.*.cmd.>"]))
    defs = load_definitions(DEFINITIONS_DIR, env="test", replicas=1)
    with pytest.raises(ProvisionConflict, match="retention"):
        await provision(js, defs)


def test_cli_dry_run_and_unreachable(nats_server: NatsServer) -> None:
    exe = [sys.executable, "-m", "mavjet.ops", "provision", "--nats", nats_server.url, "--env", "cli"]
    out = subprocess.run([*exe, "--dry-run"], capture_output=True, text=True, timeout=60, check=True)
    assert "would create    stream TWIN_STATE" in out.stdout
    out = subprocess.run(exe, capture_output=True, text=True, timeout=60, check=True)
    assert "create    kv TWIN_SHADOW" in out.stdout
    out = subprocess.run(exe, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.count("unchanged") == len(load_definitions(DEFINITIONS_DIR, env="cli", replicas=1))
    bad = subprocess.run(
        [sys.executable, "-m", "mavjet.ops", "provision", "--nats", "nats://127.0.0.1:1"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert bad.returncode == 2 and "cannot reach NATS" in bad.stderr


async def test_twin_cmd_takes_more_than_a_thousand_vehicle_consumers(provisioned: Client) -> None:
    # nats-server caps a stream with no max_consumers at 1,000; TWIN_CMD has one consumer per vehicle.
    js = provisioned.jetstream()
    assert (await js.stream_info("TWIN_CMD")).config.max_consumers == 100_000
    for i in range(1001):
        await js.add_consumer("TWIN_CMD", jsapi.ConsumerConfig(
            durable_name=f"gw_V{i}", filter_subject=f"fleet.test.veh.V{i}.cmd.>", ack_policy=jsapi.AckPolicy.EXPLICIT))
    assert (await js.stream_info("TWIN_CMD")).state.consumer_count == 1001


class _RacingJs:
    """add_stream as a fresh nats-server answers it while its probe stream's directory is being removed."""

    def __init__(self, failures: int, err_code: int = 10049) -> None:
        self.failures, self.err_code, self.calls = failures, err_code, 0

    async def add_stream(self, config: object) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise APIError(code=500, description="error creating store for stream", err_code=self.err_code)


async def test_the_servers_store_race_is_tried_again_other_errors_are_not() -> None:
    from mavjet.ops.reserve import STORE_RACE_ATTEMPTS, add_stream_retrying

    ok = _RacingJs(failures=1)
    await add_stream_retrying(ok, jsapi.StreamConfig(name="S"))  # type: ignore[arg-type]
    assert ok.calls == 2
    stuck = _RacingJs(failures=99)
    with pytest.raises(APIError):
        await add_stream_retrying(stuck, jsapi.StreamConfig(name="S"))  # type: ignore[arg-type]
    assert stuck.calls == STORE_RACE_ATTEMPTS
    other = _RacingJs(failures=1, err_code=10047)  # insufficient resources: never tried again
    with pytest.raises(APIError):
        await add_stream_retrying(other, jsapi.StreamConfig(name="S"))  # type: ignore[arg-type]
    assert other.calls == 1
