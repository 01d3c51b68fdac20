"""MAVProxy through `mavjet tunnel` against a PX4 vehicle (ArduPilot's side is tests/ops/test_tunnel_mavproxy.py's
scenario, run as it is): the ground station sees the vehicle, reads a parameter by PX4's name and switches it to
AUTO.LAND (PX4 always accepts it), which the gateway, serving the vehicle meanwhile, sees."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from mavjet.gateway.daemon import Gateway
from tests.gateway.test_routes import _free_udp_port
from tests.ops.test_tunnel_mavproxy import mavproxy_through_tunnel
from tests.support import gateway_config, running, wait_for_async


async def mavproxy_lands_a_px4_through_the_tunnel(endpoints: list[str], url: str, tmp_path: Path) -> None:
    cfg = replace(gateway_config(url, endpoints, tmp_path / "state"), tunnel=True)
    port = _free_udp_port()
    async with running(Gateway(cfg)) as gw:
        model = gw.twins["VID-001"].model

        async def identified() -> bool:
            return model.sysid is not None and model.mode == "AUTO.LOITER"

        await wait_for_async(identified, timeout_s=60)
        sysid = model.sysid
        async with mavproxy_through_tunnel(url, port, tmp_path) as console:
            await console.expect(f"Detected vehicle {sysid}:1")  # its heartbeats through the tunnel
            await console.send("param fetch MAV_SYS_ID")
            await console.expect(f"MAV_SYS_ID = {sysid}")
            # MAVProxy's own `mode LAND` fails on PX4 here (pymavlink packs px4_map's (29, 4, 6) tuple as param1):
            # the same DO_SET_MODE by hand, custom mode flag, main mode AUTO (4), sub mode LAND (6).
            await console.send("long DO_SET_MODE 1 4 6")
            await console.expect("Got COMMAND_ACK: DO_SET_MODE: ACCEPTED")

            async def landing() -> bool:
                return model.mode == "AUTO.LAND"

            try:
                await wait_for_async(landing, timeout_s=10)  # the gateway saw the ground station's mode change
            except AssertionError:
                raise AssertionError(f"still {model.mode}; MAVProxy said: {console.text[-1500:]!r}") from None
