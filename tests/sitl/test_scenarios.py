"""The scenarios of `tests.sitl.scenarios`, against the simulator and (when ARDUCOPTER_BIN / PX4_BIN are set) real
ArduCopter SITL and real PX4 SITL (SIH). A scenario that does not apply to a flavour skips with its reason."""

from __future__ import annotations

from pathlib import Path

import pytest
from nats.aio.client import Client

from mavjet.ops.natsserver import NatsServer
from tests.ops.test_tunnel_mavproxy import MAVPROXY, mavproxy_changes_mode_through_the_tunnel
from tests.sitl import faults, owners, scenarios, shadow, signing, tunnel
from tests.sitl.peers import Peer


def applies(peer: Peer, scenario: str) -> None:
    why = peer.names.skip(scenario)
    if why is not None:
        pytest.skip(why)

# A real SITL needs ~10 s of wall time to become armable (speedup 5) and flies in real physics.
pytestmark = pytest.mark.timeout(600)


async def test_guided_flight(peer: Peer, provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    async with peer.start(1, tmp_path) as site, \
            scenarios.gateway_on(provisioned, nats_server.url, site.endpoints, tmp_path / "state") as rig:
        await scenarios.fly_guided(rig, "VID-001", armable_within_s=peer.armable_within_s, names=peer.names)


async def test_qgc_plan_with_fence_and_rally_uploads(
    peer: Peer, provisioned: Client, nats_server: NatsServer, tmp_path: Path
) -> None:
    async with peer.start(1, tmp_path) as site, \
            scenarios.gateway_on(provisioned, nats_server.url, site.endpoints, tmp_path / "state") as rig:
        await scenarios.upload_qgc_plan(rig, "VID-001", names=peer.names)


async def test_two_vehicles_on_one_gateway(peer: Peer, provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    async with peer.start(2, tmp_path) as site, \
            scenarios.gateway_on(provisioned, nats_server.url, site.endpoints, tmp_path / "state") as rig:
        await scenarios.two_vehicles(rig, armable_within_s=peer.armable_within_s, names=peer.names)


async def test_qgc_plan_flies_in_auto_to_landed(peer: Peer, provisioned: Client, nats_server: NatsServer,
                                                tmp_path: Path) -> None:
    async with peer.start(1, tmp_path) as site, \
            scenarios.gateway_on(provisioned, nats_server.url, site.endpoints, tmp_path / "state") as rig:
        await scenarios.fly_qgc_mission(rig, "VID-001", armable_within_s=peer.armable_within_s, names=peer.names)


async def test_shadow_params_read_back(peer: Peer, provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    async with peer.start(1, tmp_path) as site, \
            scenarios.gateway_on(provisioned, nats_server.url, site.endpoints, tmp_path / "state", shadow=True) as rig:
        await shadow.shadow_params(rig, "VID-001", peer.names)


async def test_shadow_mission_and_geofence_converge(peer: Peer, provisioned: Client, nats_server: NatsServer,
                                                    tmp_path: Path) -> None:
    applies(peer, "geofence_shadow")
    async with peer.start(1, tmp_path) as site, \
            scenarios.gateway_on(provisioned, nats_server.url, site.endpoints, tmp_path / "state", shadow=True) as rig:
        await shadow.shadow_mission_and_geofence(rig, "VID-001")


async def test_signed_gateway_and_an_ignored_unsigned_injector(peer: Peer, provisioned: Client, nats_server: NatsServer,
                                                               tmp_path: Path) -> None:
    applies(peer, "signing")
    async with peer.start(1, tmp_path) as site:
        await signing.signed_gateway_ignores_unsigned_injector(site, provisioned, nats_server.url, tmp_path,
                                                               armable_within_s=peer.armable_within_s)


async def test_link_loss_mid_command(peer: Peer, provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    async with peer.start(1, tmp_path) as site:
        await faults.link_loss_mid_command(site, provisioned, nats_server.url, tmp_path)


async def test_terrain_plan_refused_without_terrain_data(peer: Peer, provisioned: Client, nats_server: NatsServer,
                                                         tmp_path: Path) -> None:
    applies(peer, "terrain")
    async with peer.start(1, tmp_path) as site, \
            scenarios.gateway_on(provisioned, nats_server.url, site.endpoints, tmp_path / "state") as rig:
        await scenarios.terrain_plan_refused(rig, "VID-001")


async def test_log_download_is_byte_identical_to_the_vehicles_file(peer: Peer, provisioned: Client,
                                                                     nats_server: NatsServer, tmp_path: Path) -> None:
    async with peer.start(1, tmp_path, logs=True) as site, \
            scenarios.gateway_on(provisioned, nats_server.url, site.endpoints, tmp_path / "state", logs=True) as rig:
        await scenarios.log_download_is_byte_identical(rig, "VID-001", site.log_file, names=peer.names,
                                                       armable_within_s=peer.armable_within_s, settle_s=4.0)


async def test_mavproxy_changes_the_mode_through_the_tunnel(peer: Peer, provisioned: Client, nats_server: NatsServer,
                                                           tmp_path: Path) -> None:
    if not MAVPROXY.exists():
        pytest.skip("MAVProxy is not installed (pip install mavjet[dev])")
    async with peer.start(1, tmp_path) as site:
        if peer.names.mavproxy:
            await mavproxy_changes_mode_through_the_tunnel(site.endpoints, nats_server.url, tmp_path)
        else:
            await tunnel.mavproxy_lands_a_px4_through_the_tunnel(site.endpoints, nats_server.url, tmp_path)


async def test_log_download_resumes_after_a_link_drop(peer: Peer, provisioned: Client, nats_server: NatsServer,
                                                     tmp_path: Path) -> None:
    async with peer.start(1, tmp_path, logs=True) as site:
        await faults.log_download_survives_a_link_drop(site, provisioned, nats_server.url, tmp_path,
                                                       armable_within_s=peer.armable_within_s, names=peer.names)


async def test_an_unknown_parameter_is_rejected(peer: Peer, provisioned: Client, nats_server: NatsServer,
                                                tmp_path: Path) -> None:
    async with peer.start(1, tmp_path) as site, \
            scenarios.gateway_on(provisioned, nats_server.url, site.endpoints, tmp_path / "state") as rig:
        await scenarios.unknown_parameter_is_rejected(rig, "VID-001")


async def test_two_gateways_on_serial0_and_serial1_one_owner(peer: Peer, provisioned: Client, nats_server: NatsServer,
                                                              tmp_path: Path) -> None:
    applies(peer, "two_gateways")
    async with peer.start(1, tmp_path) as site:
        await owners.two_gateways_one_owner(site, provisioned, nats_server.url, tmp_path, peer.names)
