"""`mavjet gateway --workers N`: slices, the shared UDP port's steering, supervision, one /metrics."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
import urllib.request
import zlib
from pathlib import Path

import pytest
import structlog
from nats.aio.client import Client
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mavjet.contract.errors import ConfigError
from mavjet.drivers.mavlink.codec import MavCodec
from mavjet.drivers.mavlink.dialect import mavlink2 as m
from mavjet.drivers.mavlink.transport import Endpoint
from mavjet.gateway.config import GatewayConfig, VehicleConfig
from mavjet.gateway.resolve import resolve_config
from mavjet.gateway.runtime.metrics import GatewayMetrics, merge_worker_metrics
from mavjet.gateway.runtime.workers import (
    RestartPolicy,
    bind_shared,
    owner,
    shared_ports,
    slices,
    worker_setup,
)
from mavjet.ops.client import CommandClient
from mavjet.ops.natsserver import NatsServer, free_port
from mavjet.ops.read import current_state
from mavjet.sim.fleet import SimConfig, SimFleet
from tests.gateway.test_shared_udp_port import UdpVehicle
from tests.support import ENV, collect_events, wait_for_async
from tests.support.commands import published_results


def test_owner_is_a_stable_hash_and_slices_partition_the_fleet() -> None:
    # CRC-32 of the vid, not Python's salted hash(): the same in every process and every release.
    assert [owner(f"VID-{i:03d}", 4) for i in range(1, 9)] == [owner(f"VID-{i:03d}", 4) for i in range(1, 9)]
    assert all(owner(f"VID-{i:03d}", 4) == zlib.crc32(f"VID-{i:03d}".encode()) % 4 for i in range(1, 9))
    vehicles = [VehicleConfig(vid=f"VID-{i:04d}", endpoint=Endpoint.parse(f"tcp:127.0.0.1:{5760 + i}"))
                for i in range(500)]
    parts = slices(vehicles, 4)
    assert sorted(v.vid for p in parts for v in p) == sorted(v.vid for v in vehicles)  # each vehicle exactly once
    assert all(owner(v.vid, 4) == i for i, p in enumerate(parts) for v in p)
    assert all(90 <= len(p) <= 160 for p in parts), [len(p) for p in parts]  # a hash spreads 500 evenly enough


def test_workers_resolve_flag_over_env_over_file() -> None:
    raw = {"workers": 3, "vehicles": [{"vid": "A", "endpoint": "tcp:127.0.0.1:5760"}]}
    assert resolve_config(raw, flags={}, environ={}).workers == 3
    assert resolve_config(raw, flags={}, environ={"MAVJET_WORKERS": "2"}).workers == 2
    assert resolve_config(raw, flags={"workers": 4}, environ={"MAVJET_WORKERS": "2"}).workers == 4
    assert resolve_config({"vehicles": raw["vehicles"]}, flags={}, environ={}).workers == 1
    with pytest.raises(ConfigError, match="MAVJET_WORKERS"):
        resolve_config(raw, flags={}, environ={"MAVJET_WORKERS": "two"})
    with pytest.raises(ConfigError, match="workers"):
        resolve_config(raw, flags={"workers": 0}, environ={})
    with pytest.raises(ConfigError, match="workers"):
        resolve_config({**raw, "workers": "3"}, flags={}, environ={})


def test_a_worker_keeps_the_routes_of_its_vehicles_only(tmp_path: Path) -> None:
    one = {"state_dir": str(tmp_path), "vehicles": [{"vid": "A", "endpoint": "tcp:127.0.0.1:5760"}],
           "routes": ["udp:127.0.0.1:14551"]}  # one vehicle: the route names none
    cfg = resolve_config(one, flags={"workers": 2}, environ={})
    mine, _, _ = worker_setup(cfg, f"{owner('A', 2)}/2", {})
    assert [str(r.endpoint) for r in mine.routes] == ["udp:127.0.0.1:14551"] and mine.workers == 1
    two = {"state_dir": str(tmp_path), "vehicles": [{"vid": v, "endpoint": f"tcp:127.0.0.1:{5760 + i}"}
                                                    for i, v in enumerate(("A", "B", "C", "D"))],
           "routes": [{"endpoint": f"udp:127.0.0.1:{14551 + i}", "vid": v} for i, v in enumerate("ABCD")]}
    cfg = resolve_config(two, flags={"workers": 2}, environ={})
    kept = [r.vid for i in range(2) if any(owner(v, 2) == i for v in "ABCD")
            for r in worker_setup(cfg, f"{i}/2", {})[0].routes]
    assert sorted(kept) == ["A", "B", "C", "D"]  # each route in exactly one worker
    structlog.contextvars.unbind_contextvars("worker")  # worker_setup tags this process's logs


def test_restart_policy_backs_off_and_gives_up_on_a_crash_loop() -> None:
    policy = RestartPolicy(initial_s=0.5, max_s=4.0, max_failures=4, window_s=60.0)
    assert [policy.on_exit(0, t) for t in (0.0, 1.0, 2.0, 3.0)] == [0.5, 1.0, 2.0, 4.0]
    assert policy.on_exit(1, 3.5) == 0.5  # per worker
    assert policy.on_exit(0, 4.0) is None  # a fifth failure within the window
    # Failures older than the window are forgotten: a worker that ran a while starts over.
    assert policy.on_exit(0, 200.0) == 0.5


def _heartbeat(sysid: int) -> bytes:
    return MavCodec(src_system=sysid, src_component=1).encode(m.MAVLink_heartbeat_message(2, 3, 0, 0, 4, 3))


def test_the_kernel_steers_each_sysid_to_its_workers_socket() -> None:
    """SO_REUSEPORT + the steering program on loopback: a sysid always reaches its owner's socket,
    one source always reaches one socket, and a sysid no worker owns falls back to the kernel's hash."""
    port = free_port()
    table = {1: 0, 2: 1, 3: 2, 4: 1}
    socks = bind_shared(Endpoint.parse(f"udp:127.0.0.1:{port}"), table, 3)
    senders: list[tuple[int, socket.socket]] = []
    try:
        for s in socks:
            s.setblocking(False)
        for sysid in (1, 2, 3, 4, 9):
            for _ in range(3):  # three sources per sysid
                c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                c.bind(("127.0.0.1", 0))
                senders.append((sysid, c))
        for _ in range(20):
            for sysid, c in senders:
                c.sendto(_heartbeat(sysid), ("127.0.0.1", port))
        seen: dict[tuple[int, tuple[str, int]], set[int]] = {}
        count = 0
        deadline = time.monotonic() + 5
        while count < 20 * len(senders) and time.monotonic() < deadline:
            for i, s in enumerate(socks):
                try:
                    data, addr = s.recvfrom(2048)
                except BlockingIOError:
                    continue
                seen.setdefault((data[5], addr), set()).add(i)
                count += 1
        assert count == 20 * len(senders)  # nothing lost on loopback
        assert len(seen) == len(senders)
        for (sysid, _addr), where in seen.items():
            assert len(where) == 1  # one source, one socket
            if sysid in table:
                assert where == {table[sysid]}  # ... and it is the owner's
        # MAVLink 1 is read at its own offset.
        sender = senders[0][1]
        sender.sendto(b"\xfe\x09\x00\x03\x01\x00" + bytes(11), ("127.0.0.1", port))
        got: list[int] = []
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            for i, s in enumerate(socks):
                try:
                    s.recvfrom(2048)
                    got.append(i)
                except BlockingIOError:
                    pass
        assert got == [table[3]]
    finally:
        for s in socks:
            s.close()
        for _, c in senders:
            c.close()


def test_shared_ports_order_sockets_by_owning_worker() -> None:
    ep = "udp:127.0.0.1:14550"
    cfg = GatewayConfig(vehicles=tuple(VehicleConfig(vid=f"VID-{i:03d}", endpoint=Endpoint.parse(ep), sysid=i)
                                       for i in range(1, 13)))
    (order, table), = shared_ports(cfg, 3).values()
    assert order == sorted({owner(v.vid, 3) for v in cfg.vehicles})
    assert all(order[table[v.sysid or 0]] == owner(v.vid, 3) for v in cfg.vehicles)


def test_merged_metrics_have_one_family_per_name_and_a_worker_label() -> None:
    texts = []
    for w in ("0", "1"):
        gm = GatewayMetrics()
        gm.publishes.labels(kind="state", result="plain").inc(10 + int(w))
        gm.publish_latency.labels(kind="state").observe(0.003)
        texts.append((w, generate_latest(gm.registry).decode()))
    fams = {f.name: f for f in merge_worker_metrics(texts)}
    pubs = fams["mavjet_publishes"]
    assert pubs.type == "counter"
    assert {(s.labels["worker"], s.value) for s in pubs.samples if s.name == "mavjet_publishes_total"} == {
        ("0", 10.0), ("1", 11.0)}
    hist = fams["mavjet_publish_latency_seconds"]
    assert {s.labels["worker"] for s in hist.samples if s.name.endswith("_count")} == {"0", "1"}


# -- the whole thing, as processes -----------------------------------------------------------------------------------


def _scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def _worker_pids(parent: int) -> dict[int, int]:
    """worker index -> pid, from /proc: the supervisor's children with --worker-slot I/N."""
    out: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            args = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent and b"--worker-slot" in args:
            out[int(args[args.index(b"--worker-slot") + 1].split(b"/")[0])] = int(entry)
    return out


def _is_worker(pid: int) -> bool:
    try:
        return b"--worker-slot" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


async def test_two_workers_split_the_fleet_restart_and_stop(
    provisioned: Client, nats_server: NatsServer, tmp_path: Path
) -> None:
    metrics_port = free_port()
    udp_port = free_port()
    udp_vids = {"VID-101": 11, "VID-104": 12}
    assert {owner(v, 2) for v in udp_vids} == {0, 1}  # the shared port really is split between the workers
    udp = [UdpVehicle(sysid, 40.0 + sysid, udp_port) for sysid in udp_vids.values()]
    stop_udp = asyncio.Event()

    async def fly() -> None:
        t = 0
        while not stop_udp.is_set() and t < 600_000:
            for v in udp:
                v.step(t)
            t += 100
            await asyncio.sleep(0.1)

    flying = asyncio.create_task(fly())
    async with SimFleet(SimConfig(vehicles=6, base_port=0, speedup=4.0)) as fleet:
        tcp_vids = [f"VID-00{i + 1}" for i in range(6)]
        assert {owner(v, 2) for v in tcp_vids} == {0, 1}
        vids = [*tcp_vids, *udp_vids]
        args = [sys.executable, "-m", "mavjet.ops", "gateway", "--workers", "2", "--nats", nats_server.url, "--env", ENV,
                "--state-dir", str(tmp_path / "state"), "--instance", "hub", "--metrics-port", str(metrics_port)]
        args += [f"--vehicle={vid}={ep}" for vid, ep in zip(tcp_vids, fleet.endpoints, strict=True)]
        args += [f"--vehicle={vid}=udp:127.0.0.1:{udp_port}?sysid={sysid}" for vid, sysid in udp_vids.items()]
        log_path = tmp_path / "gateway.log"
        with log_path.open("wb") as log_file:
            proc = await asyncio.create_subprocess_exec(*args, stdout=log_file, stderr=log_file)
        try:
            def log_tail() -> str:
                return log_path.read_text(errors="replace")[-3000:]

            async def links_by_worker() -> dict[str, set[str]] | None:
                try:
                    mm = await asyncio.to_thread(_scrape, metrics_port)
                except OSError:
                    return None
                by_vid: dict[str, set[str]] = {}
                for labels, value in mm.get("mavjet_link_up", []):
                    if value == 1.0:
                        by_vid.setdefault(labels["vid"], set()).add(labels["worker"])
                ready = {labels["worker"] for labels, v in mm.get("mavjet_worker_ready", []) if v == 1.0}
                return by_vid if set(by_vid) == set(vids) and ready == {"0", "1"} else None

            by_vid = await wait_for_async(links_by_worker, 60, what=f"every link up\n{log_tail()}")
            # Each vehicle is served by exactly one worker: its owner.
            assert {vid: w for vid, w in by_vid.items()} == {vid: {str(owner(vid, 2))} for vid in vids}
            js = provisioned.jetstream()

            async def all_state() -> bool:
                st = await current_state(js, ENV)
                return all((vid, "position") in st for vid in vids)

            await wait_for_async(all_state, 30)
            st = await current_state(js, ENV)
            assert round(st[("VID-104", "position")].data["lat_deg"], 3) == 52.0  # the shared port's vehicles too
            # One command to each vehicle: exactly one cmd_result each (one worker pulls each vehicle's consumer).
            async with published_results(provisioned) as seen, CommandClient(provisioned, ENV, issuer="pytest") as cc:
                results = await asyncio.gather(*(cc.call(vid, "param_get", {"name": "RTL_ALT"}, timeout_s=40)
                                                 for vid in tcp_vids))
                assert all(r.accepted for r in results), results
                await asyncio.sleep(1.0)  # a second result would have arrived by now
            ids = [d["cmd_id"] for d in seen]
            assert sorted(ids) == sorted(r.cmd_id for r in results)
            # Kill a worker: the supervisor restarts it and its vehicles come back, the other worker's stay.
            pids = _worker_pids(proc.pid)
            assert set(pids) == {0, 1}
            os.kill(pids[0], signal.SIGKILL)

            async def restarted() -> dict[str, set[str]] | None:
                mm = await asyncio.to_thread(_scrape, metrics_port)
                restarts = {labels["worker"]: v for labels, v in mm.get("mavjet_worker_restarts_total", [])}
                new = _worker_pids(proc.pid)
                if restarts.get("0") != 1.0 or new.get(0) in (None, pids[0]):
                    return None
                return await links_by_worker()

            by_vid = await wait_for_async(restarted, 60, what=f"worker 0 restarted\n{log_tail()}")
            assert by_vid == {vid: {str(owner(vid, 2))} for vid in vids}
            assert _worker_pids(proc.pid)[1] == pids[1]
            # The restarted worker owns its vehicles again once its killed predecessor's leases went
            # stale (TTL 5 s, docs/ownership.md): only then is it the one to report their stop.

            async def all_owned() -> bool:
                mm = await asyncio.to_thread(_scrape, metrics_port)
                owned = {labels["vehicle"] for labels, v in mm.get("mavjet_vehicle_owner", []) if v == 1.0}
                return owned == set(vids)

            await wait_for_async(all_owned, 30, what=f"every vehicle owned again\n{log_tail()}")
            # SIGTERM to the supervisor stops every worker cleanly.
            children = _worker_pids(proc.pid)
            proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(60):
                rc = await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            stop_udp.set()
            await flying
            for v in udp:
                v.sock.close()
    assert rc == 0, log_tail()
    assert not [pid for pid in children.values() if _is_worker(pid)]  # none left behind
    events = await collect_events(provisioned)
    stopped = {(v, d["gateway"]) for v, t, d, _ in events if t == "gateway_stopped" and d["reason"] == "SIGTERM"}
    assert stopped == {(vid, f"hub-w{owner(vid, 2)}") for vid in vids}


async def test_a_shared_port_taken_by_another_process_exits_2_with_one_line(tmp_path: Path) -> None:
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as squatter:  # no SO_REUSEPORT: nobody may join it
        squatter.bind(("127.0.0.1", port))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "mavjet.ops", "gateway", "--workers", "2", "--nats", "nats://127.0.0.1:1",
            "--state-dir", str(tmp_path / "state"),
            *[f"--vehicle=VID-10{i}=udp:127.0.0.1:{port}?sysid={i}" for i in range(1, 5)],
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(60):
            _out, err = await proc.communicate()
    assert proc.returncode == 2
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1 and "cannot share udp:127.0.0.1:" in lines[0] and "vehicles.endpoint" in lines[0], lines


def test_a_worker_serves_metrics_on_the_supervisors_socket_without_binding(tmp_path: Path) -> None:
    """The supervisor listens before the worker starts; the worker serves on the inherited fd."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    fd = listener.detach()  # the fd now belongs to the worker's side, as after a fork
    cfg = resolve_config({"state_dir": str(tmp_path), "vehicles": [{"vid": "A", "endpoint": "tcp:127.0.0.1:5760"},
                                                                   {"vid": "B", "endpoint": "tcp:127.0.0.1:5770"}]},
                         flags={"workers": 2}, environ={})
    slot = owner("A", 2)
    wcfg, _, inherited = worker_setup(cfg, f"{slot}/2", {"MAVJET_WORKER_METRICS_FD": str(fd)})
    structlog.contextvars.unbind_contextvars("worker")
    assert inherited is not None and wcfg.metrics_port is None  # nothing for the worker to bind
    metrics = GatewayMetrics()
    assert metrics.serve_on(inherited) == port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        body = resp.read().decode()
    assert "mavjet_build_info" in body  # the socket stays with the serving thread, as in a worker
