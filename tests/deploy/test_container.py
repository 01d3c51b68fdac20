"""The edge hub's container image and compose file, tested without a container engine.

No Docker or Podman on these machines: the Containerfile and compose.yaml are
checked for internal consistency against the repository (every copied path
exists, every config they name validates, every command line parses with the
real argument parsers), and the health check runs as a plain process.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from mavjet.gateway.entry import build_parser as gateway_parser
from mavjet.gateway.resolve import build_config
from mavjet.ops.monitor import build_parser as monitor_parser
from mavjet.ops.natsserver import free_port
from mavjet.ops.provision import build_parser as provision_parser
from mavjet.ops.provision import load_definitions

from . import yamlsubset

ROOT = Path(__file__).resolve().parents[2]
CONTAINERFILE = ROOT / "deploy" / "container" / "Containerfile"
HEALTHCHECK = ROOT / "deploy" / "container" / "healthcheck.py"
COMPOSE = ROOT / "deploy" / "edge-hub" / "compose.yaml"


def instructions() -> list[tuple[str, str]]:
    """Containerfile -> [(INSTRUCTION, arguments)], continuations joined, comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in CONTAINERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def final_stage() -> list[tuple[str, str]]:
    ins = instructions()
    last_from = max(i for i, (w, _) in enumerate(ins) if w == "FROM")
    return ins[last_from:]


def test_containerfile_is_small_non_root_and_runs_the_gateway() -> None:
    text = CONTAINERFILE.read_text()
    assert not any(re.search(r"\b(curl|wget)\b", rest) for _, rest in instructions())
    stage = dict(final_stage())
    user = stage["USER"].split(":")[0]
    assert user not in ("root", "0") and int(user) >= 1000
    assert json.loads(stage["ENTRYPOINT"]) == ["mavjet", "gateway"]
    assert "mavjet = \"mavjet.ops.cli:main\"" in (ROOT / "pyproject.toml").read_text()
    # The default command is one the gateway accepts.
    cmd = json.loads(stage["CMD"])
    args = gateway_parser().parse_args(cmd)
    assert str(args.config) == "/etc/mavjet/gateway.toml" and args.metrics_port == 9108
    # Multi-stage: the build tools stay in the first stage.
    assert [w for w, _ in instructions()].count("FROM") == 2
    # The image runs the hot path compiled (ops/compile.py), and the build fails if it would not.
    build_runs = " ".join(rest for w, rest in instructions()[: len(instructions()) - len(final_stage())] if w == "RUN")
    assert re.search(r"mavjet compile\s+&&", build_runs) and "mavjet compile --check" in build_runs
    assert "gcc" in build_runs and not any("gcc" in rest for w, rest in final_stage() if w == "RUN")
    assert "slim" in text


def test_containerfile_copies_exist_and_healthcheck_uses_python() -> None:
    dests: dict[str, str] = {}
    for word, rest in instructions():
        if word != "COPY" or rest.startswith("--from"):
            continue
        *srcs, dest = rest.split()
        for src in srcs:
            assert (ROOT / src).exists(), f"COPY source {src} is not in the repository"
            dests[src] = dest
    assert dests["deploy/container/healthcheck.py"] == "/opt/mavjet/bin/mavjet-healthcheck"
    # The build stage copies every folder the wheel maps to mavjet.<folder>: one missing fails pip install.
    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    assert {dests.get(folder) for folder in package_dir.values()} == {f"./{f}" for f in package_dir.values()}
    stage = dict(final_stage())
    hc = stage["HEALTHCHECK"]
    m = re.search(r"CMD (\[.*\])", hc)
    assert m is not None
    hc_cmd = json.loads(m.group(1))
    assert hc_cmd[:2] == ["python", "/opt/mavjet/bin/mavjet-healthcheck"]
    # The rest are health check options (test_healthcheck_gateway.py runs them against a real gateway).
    assert all(a.startswith("--") for a in hc_cmd[2::2])
    assert "MAVJET_METRICS_PORT=9108" in stage["ENV"].replace(" ", "")
    # Provisioning inside the image reads the definitions from where they are copied.
    assert dests["deploy/jetstream"] == "/opt/mavjet/share/jetstream"


def test_compose_is_consistent() -> None:
    doc = yamlsubset.loads(COMPOSE.read_text())
    services = doc["services"]
    assert {"nats-1", "nats-2", "nats-3", "gateway", "provision", "monitor"} <= set(services)
    for n in (1, 2, 3):
        svc = services[f"nats-{n}"]
        conf = svc["command"][svc["command"].index("--config") + 1]
        local = COMPOSE.parent / "nats" / Path(conf).name
        assert conf.startswith("/etc/nats/") and local.is_file()
        assert f"server_name: nats-{n}" in local.read_text()
        assert "./nats:/etc/nats:ro" in svc["volumes"]
        assert f"nats-{n}-data:/data" in svc["volumes"] and f"nats-{n}-data" in doc["volumes"]
    servers = services["gateway"]["environment"]["MAVJET_NATS"].split(",")
    assert servers == [f"nats://nats-{n}:4222" for n in (1, 2, 3)]
    # The provision job creates R3 resources from the definitions baked into the image.
    prov = services["provision"]
    assert prov["entrypoint"] == ["mavjet", "provision"]
    pargs = provision_parser().parse_args(prov["command"])
    assert pargs.replicas == 3 and str(pargs.definitions) == "/opt/mavjet/share/jetstream"
    names = {d.name for d in load_definitions(ROOT / "deploy" / "jetstream", env="prod", replicas=3)}
    assert names == {"TWIN_STATE", "TWIN_EVENTS", "TWIN_CMD", "TWIN_SHADOW", "TWIN_BLOBS", "TWIN_LOGS", "TWIN_TRACKS",
                     "TWIN_LEASES", "TWIN_ROLLOUTS"}
    assert services["gateway"]["depends_on"]["provision"]["condition"] == "service_completed_successfully"
    margs = monitor_parser().parse_args(services["monitor"]["command"])
    assert margs.listen == "0.0.0.0:9464"
    # The gateway's mounted config is valid for the real config loader.
    mount = next(v for v in services["gateway"]["volumes"] if v.endswith(":/etc/mavjet/gateway.toml:ro"))
    cfg = build_config(tomllib.loads((COMPOSE.parent / mount.split(":")[0]).read_text()))
    assert cfg.metrics_port == 9108 and cfg.metrics_host == "0.0.0.0"
    # The hub runs on uvloop, which the image installs with the `edge` extra.
    assert cfg.uvloop is True and ".[edge]" in CONTAINERFILE.read_text()
    ports = [e.endpoint.port for e in cfg.vehicles]
    lo, hi = (int(x) for x in services["gateway"]["ports"][0].split(":")[0].split("-"))
    assert all(lo <= p <= hi for p in ports)
    assert services["gateway"]["read_only"] is True and services["gateway"]["cap_drop"] == ["ALL"]


def test_example_config_is_valid_and_keeps_credentials_by_path() -> None:
    raw = tomllib.loads((ROOT / "deploy" / "gateway.example.toml").read_text())
    cfg = build_config(raw)
    assert cfg.nats.creds_file == "/etc/mavjet/nats.creds"
    assert len(cfg.nats.servers) == 3
    text = (ROOT / "deploy" / "gateway.example.toml").read_text()
    assert not re.search(r"(SUAC|-----BEGIN|password\s*=)", text), "no inline secrets"


def run_healthcheck(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(HEALTHCHECK), *args], capture_output=True, text=True,
                          timeout=30, check=False, env=env)


@pytest.fixture
def metrics_server() -> Iterator[tuple[int, Gauge]]:
    reg = CollectorRegistry()
    up = Gauge("mavjet_nats_connected", "test", registry=reg)
    ts = Gauge("mavjet_loop_last_tick_timestamp_seconds", "test", registry=reg)
    ts.set(time.time())
    server, thread = start_http_server(0, addr="127.0.0.1", registry=reg)
    try:
        yield server.server_address[1], up
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_healthcheck_healthy_and_requirements(metrics_server: tuple[int, Gauge]) -> None:
    port, up = metrics_server
    url = f"http://127.0.0.1:{port}/metrics"
    ok = run_healthcheck("--url", url)
    assert ok.returncode == 0 and ok.stdout.strip() == "healthy"
    bad = run_healthcheck("--url", url, "--require", "mavjet_nats_connected")
    assert bad.returncode == 1 and "mavjet_nats_connected is 0" in bad.stdout
    up.set(1)
    assert run_healthcheck("--url", url, "--require", "mavjet_nats_connected").returncode == 0
    assert run_healthcheck("--url", url, "--require", "mavjet_nope").returncode == 1
    fresh = run_healthcheck("--url", url, "--max-age", "mavjet_loop_last_tick_timestamp_seconds=60")
    assert fresh.returncode == 0
    time.sleep(1.2)
    stale = run_healthcheck("--url", url, "--max-age", "mavjet_loop_last_tick_timestamp_seconds=1")
    assert stale.returncode == 1 and "old" in stale.stdout


def test_healthcheck_port_from_environment(metrics_server: tuple[int, Gauge]) -> None:
    port, _ = metrics_server
    env = {**os.environ, "MAVJET_METRICS_PORT": str(port)}
    env.pop("MAVJET_METRICS_URL", None)
    assert run_healthcheck(env=env).returncode == 0


def test_healthcheck_unhealthy_when_down_or_erroring() -> None:
    down = run_healthcheck("--url", f"http://127.0.0.1:{free_port()}/metrics", "--timeout", "1")
    assert down.returncode == 1 and down.stdout.startswith("unhealthy")

    class Err(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(500)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return

    class NotOurs(Err):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"python_info 1\n")

    for handler, reason in ((Err, "500"), (NotOurs, "no mavjet metrics")):
        srv = http.server.HTTPServer(("127.0.0.1", 0), handler)
        t = threading.Thread(target=srv.serve_forever, daemon=True)
        t.start()
        try:
            out = run_healthcheck("--url", f"http://127.0.0.1:{srv.server_address[1]}/metrics")
            assert out.returncode == 1 and reason in out.stdout, out.stdout
        finally:
            srv.shutdown()
            srv.server_close()
