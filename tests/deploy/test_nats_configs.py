"""Every nats-server config in deploy/ is accepted by nats-server itself (`-t`)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from mavjet.contract.natsconn import open_client
from mavjet.ops import auth
from mavjet.ops.natsserver import NatsServer, nats_server_binary
from mavjet.ops.provision import DEFINITIONS_DIR, load_definitions, provision

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted(
    p for p in [*(ROOT / "deploy").rglob("*.conf")]
    if p.parent.name != "systemd" and "common" not in p.name
)
MACHINE_PATH = re.compile(r"/(work|root|home|tmp)/")


def check(path: Path) -> subprocess.CompletedProcess[str]:
    if "include ../auth/auth.conf" in "".join(p.read_text() for p in path.parent.glob("*.conf")):
        # The edge hub includes the output of `mavjet auth init` (docs/security.md): generate one beside a copy.
        with tempfile.TemporaryDirectory(prefix="mavjet-auth-") as tmp:
            shutil.copytree(path.parent, Path(tmp) / "nats")
            auth.init(Path(tmp) / "auth", env="prod", vehicles=["VID-001"], gateways={"hub": ["VID-002"]})
            return _check(Path(tmp) / "nats" / path.name)
    return _check(path)


def _check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([nats_server_binary(), "-t", "-c", str(path)], capture_output=True,
                          text=True, timeout=30, check=False)


def test_all_expected_configs_exist() -> None:
    names = {str(p.relative_to(ROOT)) for p in CONFIGS}
    assert {
        "deploy/nats/single.conf",
        "deploy/nats/leaf.conf",
        "deploy/nats/cluster/hub-1.conf",
        "deploy/nats/cluster/hub-2.conf",
        "deploy/nats/cluster/hub-3.conf",
        "deploy/edge-hub/nats/nats-1.conf",
        "deploy/edge-hub/nats/nats-2.conf",
        "deploy/edge-hub/nats/nats-3.conf",
    } <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_nats_server_accepts(path: Path) -> None:
    out = check(path)
    assert out.returncode == 0, out.stderr + out.stdout
    text = path.read_text()
    assert not MACHINE_PATH.search(text), "configs must not name paths of a particular machine"


def test_check_rejects_a_broken_config(tmp_path: Path) -> None:
    bad = tmp_path / "bad.conf"
    bad.write_text((ROOT / "deploy/nats/single.conf").read_text() + "\njetstream { max_file_stor: 1GB }\n")
    out = check(bad)
    assert out.returncode != 0 and "max_file_stor" in out.stderr


def test_cluster_nodes_share_routes_and_differ_in_name() -> None:
    for folder, prefix in (("deploy/nats/cluster", "hub"), ("deploy/edge-hub/nats", "nats")):
        common = (ROOT / folder / "common.conf").read_text()
        routes = re.findall(r'"nats://([\w-]+):6222"', common)
        assert routes == [f"{prefix}-{n}" for n in (1, 2, 3)]
        for n in (1, 2, 3):
            text = (ROOT / folder / f"{prefix}-{n}.conf").read_text()
            assert f"server_name: {prefix}-{n}" in text and "include ./common.conf" in text


def test_leaf_config_has_its_own_domain_and_creds_by_path() -> None:
    text = (ROOT / "deploy/nats/leaf.conf").read_text()
    assert re.search(r"^\s*domain:\s*\S+", text, re.M)
    assert re.search(r'credentials:\s*"/etc/mavjet/[\w.-]+\.creds"', text)
    assert "listen: 127.0.0.1:4222" in text  # only the local gateway connects


async def test_single_node_config_runs_and_takes_the_twin(tmp_path: Path) -> None:
    """The single-node config is not only valid: the twin's reservations fit in it."""
    conf = tmp_path / "single.conf"
    conf.write_text((ROOT / "deploy/nats/single.conf").read_text()
                    .replace("listen: 0.0.0.0:4222", "listen: 127.0.0.1:4222")
                    .replace("0.0.0.0:7422", "127.0.0.1:-1")
                    .replace("http: 127.0.0.1:8222", "http: 127.0.0.1:-1")
                    # NatsServer passes the store as -sd (a temporary directory).
                    .replace('store_dir: "jetstream"', ""))
    srv = NatsServer(config_file=str(conf), store_dir=str(tmp_path / "js"), log_file=str(tmp_path / "log"))
    with srv:
        nc = await open_client(srv.url, connect_timeout=2)
        try:
            actions = await provision(nc.jetstream(), load_definitions(DEFINITIONS_DIR, env="prod", replicas=1))
            assert {a.verb for a in actions} == {"create"}
            assert (await nc.jetstream().stream_info("TWIN_EVENTS")).config.max_bytes == 100 * 1024**3
        finally:
            await nc.close()
