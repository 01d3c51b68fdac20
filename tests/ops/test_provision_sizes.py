"""Provisioning sizes: presets, explicit --max-bytes, refusals with numbers, dry runs and all-or-nothing,
against a real nats-server whose JetStream file store is limited like a small machine's."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from nats.js import api as jsapi

from mavjet.contract.errors import MavjetError
from mavjet.contract.natsconn import open_client
from mavjet.ops.natsserver import NatsServer
from mavjet.ops.provision import DEFINITIONS_DIR, ProvisionTooLarge, load_definitions, provision
from mavjet.ops.reserve import GiB, headroom_bytes, reservable


@pytest.fixture
def small_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A nats-server allowed 4 GiB of file store: the contract's 110 GB does not fit, `small` does."""
    conf = tmp_path / "small.conf"
    conf.write_text("jetstream { max_file_store: 4GB, max_memory_store: 256MB }\n")
    srv = NatsServer(store_dir=str(tmp_path / "js"), config_file=str(conf), log_file=str(tmp_path / "nats.log"))
    srv.start()
    try:
        yield srv
    finally:
        srv.cleanup()


def test_presets_and_explicit_sizes_set_max_bytes() -> None:
    small = {d.stream_name: d.config.max_bytes for d in load_definitions(DEFINITIONS_DIR, env="t", replicas=1, size="small")}
    assert small["TWIN_EVENTS"] == 1 * GiB and small["TWIN_STATE"] == 256 * 1024**2 and small["OBJ_TWIN_BLOBS"] == 1 * GiB
    large = {d.stream_name: d.config.max_bytes for d in load_definitions(DEFINITIONS_DIR, env="t", replicas=1, size="large")}
    assert large["TWIN_EVENTS"] == 100 * GiB  # the definitions as written
    mixed = {d.stream_name: d.config.max_bytes for d in load_definitions(
        DEFINITIONS_DIR, env="t", replicas=1, size="small", max_bytes={"TWIN_EVENTS": 3 * GiB, "TWIN_BLOBS": 2 * GiB})}
    assert mixed["TWIN_EVENTS"] == 3 * GiB and mixed["OBJ_TWIN_BLOBS"] == 2 * GiB and mixed["TWIN_STATE"] == 256 * 1024**2
    with pytest.raises(MavjetError, match="no such resource"):
        load_definitions(DEFINITIONS_DIR, env="t", replicas=1, max_bytes={"TWIN_NOPE": 1})
    with pytest.raises(MavjetError, match="size must be"):
        load_definitions(DEFINITIONS_DIR, env="t", replicas=1, size="huge")


async def test_headroom_is_measured_without_leaving_anything(small_server: NatsServer) -> None:
    nc = await open_client(small_server.url)
    try:
        js = nc.jetstream()
        assert await reservable(js, 1 * GiB) and not await reservable(js, 100 * GiB)
        room = await headroom_bytes(js, 100 * GiB)
        assert 3 * GiB < room <= 4 * GiB
        assert (await js.account_info()).streams == 0  # every probe stream was deleted
    finally:
        await nc.close()


async def test_too_large_is_refused_with_numbers_before_anything_changes(small_server: NatsServer) -> None:
    nc = await open_client(small_server.url)
    try:
        js = nc.jetstream()
        defs = load_definitions(DEFINITIONS_DIR, env="t", replicas=1)
        for dry in (True, False):
            with pytest.raises(ProvisionTooLarge) as ei:
                await provision(js, defs, dry_run=dry)
            text = str(ei.value)
            assert "110.0 GiB" in text and "TWIN_EVENTS 100.0 GiB" in text and "--size medium" not in text
            assert "--size small" in text and 3 * GiB < ei.value.headroom <= 4 * GiB
            assert (await js.account_info()).streams == 0  # all or nothing: nothing was created
        actions = await provision(js, load_definitions(DEFINITIONS_DIR, env="t", replicas=1, size="small"))
        assert {a.verb for a in actions} == {"create"}
        info = await js.stream_info("TWIN_EVENTS")
        assert info.config.max_bytes == 1 * GiB
    finally:
        await nc.close()


async def test_a_failure_midway_is_undone(small_server: NatsServer) -> None:
    nc = await open_client(small_server.url)
    try:
        js = nc.jetstream()
        # Something else holds a subject TWIN_STATE wants: its create fails after others were created.
        await js.add_stream(jsapi.StreamConfig(name="SQUATTER", subjects=["fleet.t.veh.*.state.>"]))
        with pytest.raises(MavjetError, match="nothing was changed"):
            await provision(js, load_definitions(DEFINITIONS_DIR, env="t", replicas=1, size="small"))
        names = [s.config.name for s in await js.streams_info()]
        assert names == ["SQUATTER"]
    finally:
        await nc.close()


def test_cli_refusal_is_one_line_and_dry_run_checks(small_server: NatsServer) -> None:
    def provision_cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "mavjet.ops", "provision", "--nats", small_server.url, *args],
                              capture_output=True, text=True, timeout=60, check=False)

    for args in ((), ("--dry-run",)):
        out = provision_cli(*args)
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert "allows" in out.stderr and "--size small" in out.stderr
    out = provision_cli("--size", "small", "--max-bytes", "TWIN_EVENTS=2GB")
    assert out.returncode == 0, out.stderr
    assert "create    stream TWIN_EVENTS" in out.stdout
