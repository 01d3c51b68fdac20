"""MAVLink 2 signing end to end: `mavjet sign` provisions the sim, a gateway with the key commands it over a
link that refuses unsigned frames, and forged (unsigned) or replayed frames are dropped and counted."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import anyio
import pytest
from nats.aio.client import Client

from mavjet.contract.errors import ConfigError
from mavjet.drivers.mavlink.codec import MavCodec
from mavjet.drivers.mavlink.dialect import mavlink2 as m
from mavjet.drivers.mavlink.link import LinkConfig, MavlinkLink
from mavjet.drivers.mavlink.signing import read_key_file
from mavjet.drivers.mavlink.transport import Endpoint
from mavjet.gateway.commands.consumer import CommandService
from mavjet.gateway.daemon import Gateway
from mavjet.gateway.resolve import build_config
from mavjet.ops import sign
from mavjet.ops.client import CommandClient
from mavjet.ops.natsserver import NatsServer
from mavjet.sim.fleet import SimConfig, SimFleet
from mavjet.sim.vehicle import SimVehicle
from tests.support import ENV, gateway_config, running, wait_for
from tests.support.commands import TEST_COMMANDS, ready_to_fly
from tests.support.sim import MavClient


def _rejected(gw: Gateway, vid: str, reason: str) -> float:
    value = gw.metrics.registry.get_sample_value("mavjet_mavlink_signing_rejected_total", {"vid": vid, "reason": reason})
    return value or 0.0


def _write_to_link(v: SimVehicle, link_id: int, data: bytes) -> None:
    """An attacker on the radio: bytes into what the vehicle's link `link_id` carries to the gateway."""
    for c in list(v.clients):
        if c.link_id == link_id and c.transport is not None:
            c.transport.write(data)


async def _setup(endpoint: str, key_file: Path, *extra: str) -> int:
    # run_cli runs its own event loop: in a thread, against the sim in this one.
    return await asyncio.to_thread(sign.main, ["setup", "VID-001", "--endpoint", endpoint, "--key-file", str(key_file),
                                               "--timeout", "5", *extra])


async def test_signed_gateway_commands_the_vehicle_and_drops_forged_and_replayed_frames(
    provisioned: Client, nats_server: NatsServer, tmp_path: Path,
) -> None:
    key_file = tmp_path / "VID-001.key"
    assert sign.main(["keygen", str(key_file)]) == 0
    key = read_key_file(key_file)
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=5.0)) as fleet:
        v = fleet.vehicles[0]
        assert await _setup(fleet.endpoints[0], key_file) == 0
        assert v.signing.enabled and v.signing.key == key
        # The gateway on the vehicle's second port: like SITL's SERIAL1 it ignores whatever is not signed.
        serial1 = await v.listen_serial(1)
        cfg = gateway_config(nats_server.url, [serial1], tmp_path / "state", commands=TEST_COMMANDS)
        cfg = dataclasses.replace(cfg, vehicles=tuple(dataclasses.replace(vc, signing_key_file=key_file)
                                                      for vc in cfg.vehicles))
        service = CommandService()
        gw = Gateway(cfg)
        gw.services.append(service)
        async with running(gw), CommandClient(provisioned, ENV, issuer="pytest") as client:
            twin = gw.twins["VID-001"]
            await wait_for(lambda: twin.link.is_up and twin.model.armed is not None and len(service.lanes) == 1
                           and all(loop.binds for loop in service.lanes.values()), timeout_s=20)
            await ready_to_fly(fleet)

            # An unsigned ARM injected on the vehicle's link 1 is ignored by the vehicle.
            injector = await MavClient.connect(serial1, compid=190)
            try:
                injector.send(m.MAVLink_command_long_message(v.sysid, 1, m.MAV_CMD_COMPONENT_ARM_DISARM, 0,
                                                             1, 0, 0, 0, 0, 0, 0))
                await wait_for(lambda: v.link.frames_in_unverified >= 1, timeout_s=5)
                assert not v.armed

                # Signed commands from the gateway work end to end.
                assert (await client.call("VID-001", "set_mode", {"mode": "GUIDED"})).accepted
                assert (await client.call("VID-001", "arm")).accepted
                assert v.armed and v.mode == "GUIDED"
                assert v.link.frames_in_unverified == 1  # nothing the gateway sent was refused
                assert v.signing.counters.accepted_signed > 0

                # Forged and replayed frames towards the gateway are dropped and counted.
                captured = bytes((await injector.recv("HEARTBEAT")).get_msgbuf())  # signed, link 1
                assert captured[2] & 1
                forged = MavCodec(src_system=v.sysid, src_component=1).encode(m.MAVLink_heartbeat_message(
                    m.MAV_TYPE_QUADROTOR, m.MAV_AUTOPILOT_ARDUPILOTMEGA, m.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED,
                    0, m.MAV_STATE_STANDBY, 3))  # unsigned, says disarmed in STABILIZE
                await anyio.sleep(0.3)  # the gateway has seen newer signed frames of that stream by now
                _write_to_link(v, 1, forged + captured)
                await wait_for(lambda: _rejected(gw, "VID-001", "unsigned") >= 1
                               and _rejected(gw, "VID-001", "replay") >= 1, timeout_s=5)
                await anyio.sleep(0.3)
                assert twin.model.armed is True  # the forged heartbeat changed nothing
                assert twin.session.is_up
            finally:
                await injector.close()


async def test_a_gateway_with_a_key_hears_nothing_from_an_unprovisioned_vehicle(tmp_path: Path) -> None:
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=5.0)) as fleet:
        link = MavlinkLink(name="VID-001", endpoint=Endpoint.parse(fleet.endpoints[0]),
                           config=LinkConfig(heartbeat_timeout_s=2.0), on_messages=lambda msgs, ns: None,
                           signing_key=bytes(range(32)))
        async with anyio.create_task_group() as tg:
            tg.start_soon(link.run)
            await wait_for(lambda: link.codec.stats.signing_rejected.get("unsigned", 0) >= 3, timeout_s=5)
            assert not link.is_up
            tg.cancel_scope.cancel()


async def test_sign_setup_disable_and_failures(tmp_path: Path) -> None:
    key_file = tmp_path / "k"
    assert sign.main(["keygen", str(key_file)]) == 0
    assert sign.main(["keygen", str(key_file)]) == 2  # a key in use is never overwritten
    assert key_file.stat().st_mode & 0o777 == 0o600
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=5.0)) as fleet:
        v = fleet.vehicles[0]
        assert await _setup(fleet.endpoints[0], key_file) == 0 and v.signing.enabled
        assert await _setup(fleet.endpoints[0], key_file) == 0  # idempotent
        assert await _setup(fleet.endpoints[0], key_file, "--disable") == 0 and not v.signing.enabled
    bad = tmp_path / "bad"
    bad.write_text("nope")
    assert await _setup("tcp:127.0.0.1:1", bad) == 2
    assert await _setup("tcp:127.0.0.1:1", key_file) == 2  # nothing listens there


async def test_sign_setup_exit_1_when_the_vehicle_does_not_sign(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key_file = tmp_path / "k"
    sign.keygen(key_file)
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=5.0)) as fleet:
        v = fleet.vehicles[0]

        def ignore(key: bytes, initial_timestamp: int) -> None:
            return None

        monkeypatch.setattr(v.signing, "setup", ignore)
        rc = await asyncio.to_thread(sign.main, ["setup", "VID-001", "--endpoint", fleet.endpoints[0],
                                                 "--key-file", str(key_file), "--timeout", "1"])
        assert rc == 1 and not v.signing.enabled


def test_vehicle_config_takes_a_signing_key_file(tmp_path: Path) -> None:
    cfg = build_config({"vehicles": [{"vid": "VID-001", "endpoint": "tcp:h:1", "signing_key_file": str(tmp_path / "k")}]})
    assert cfg.vehicles[0].signing_key_file == tmp_path / "k"
    with pytest.raises(ConfigError, match="signing_key_file"):
        build_config({"vehicles": [{"vid": "VID-001", "endpoint": "tcp:h:1", "signing_key_file": 7}]})
    with pytest.raises(ConfigError, match="cannot read"):
        read_key_file(tmp_path / "missing")


def test_sign_setup_reads_endpoint_and_key_from_the_gateway_config(tmp_path: Path, capsys: Any) -> None:
    toml = tmp_path / "gw.toml"
    toml.write_text('[[vehicles]]\nvid = "VID-001"\nendpoint = "tcp:127.0.0.1:1"\n')
    assert sign.main(["setup", "VID-001", "--config", str(toml)]) == 2
    assert "--key-file" in capsys.readouterr().err
    assert sign.main(["setup", "VID-009", "--config", str(toml), "--key-file", "x"]) == 2
    assert "VID-009" in capsys.readouterr().err
