"""Random SIGKILLs of a real gateway process during a stream of commands: never twice, one result each.

Commands cycle through three modes, so consecutive commands differ: a command
executed twice shows at the vehicle as the same mode set twice in a row (the
next command is delivered only once the previous one is finished). The sim
records every command it acted on (`executions`, first transmissions and
retransmissions it did not recognise alike).
"""

from __future__ import annotations

import asyncio
import random
import signal
from collections import Counter
from pathlib import Path

from nats.aio.client import Client

from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.ops.client import CommandClient
from mavjet.ops.natsserver import NatsServer
from mavjet.sim.fleet import SimConfig, SimFleet
from mavjet.sim.vehicle import SimVehicle
from tests.commands.test_crash import start_gateway, stop, stream_drained
from tests.support.commands import ENV, cmd_results, ready_to_fly
from tests.support.wait import wait_for_async

SET_MODE = mavlink2.MAV_CMD_DO_SET_MODE
MODES = ("GUIDED", "LOITER", "STABILIZE")
COMMANDS = 60
KILLS = 5


async def _executed_after(v: SimVehicle, n: int) -> bool | None:
    return sum(e.command == SET_MODE for e in v.executions) >= n or None


async def test_random_sigkills_never_execute_twice(provisioned: Client, nats_server: NatsServer,
                                                    tmp_path: Path) -> None:
    rng = random.Random(11)
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=5.0)) as fleet:
        v = fleet.vehicles[0]
        await ready_to_fly(fleet)
        async with CommandClient(provisioned, ENV, issuer="pytest") as client:
            proc = await start_gateway(nats_server.url, fleet.endpoints[0], tmp_path, "gw0.log")
            first = await client.call("VID-001", "param_get", {"name": "RTL_ALT"}, timeout_s=40)
            assert first.accepted, first
            ids: list[str] = []
            kills = 0
            try:
                ids += [await client.publish("VID-001", "set_mode", {"mode": MODES[i % 3]}, deadline_s=120)
                        for i in range(COMMANDS)]
                for k in range(KILLS):
                    # Kill while the stream is being executed, at a random moment after a command reached the vehicle.
                    await wait_for_async(lambda n=(k + 1) * COMMANDS // (KILLS + 1): _executed_after(v, n), 60, 0.001,
                                         what="commands executed")
                    await asyncio.sleep(rng.uniform(0.0, 0.008))
                    proc.send_signal(signal.SIGKILL)
                    await proc.wait()
                    kills += 1
                    proc = await start_gateway(nats_server.url, fleet.endpoints[0], tmp_path, f"gw{kills}.log")
                for cmd_id in ids:
                    r = await client.wait(cmd_id, 90, vid="VID-001")
                    assert r.result in ("accepted", "unknown"), r
                await stream_drained(provisioned, timeout_s=30)
                # The results above may all have come from earlier processes: a SIGTERM to the last
                # one while it is still importing ends it by the signal, before its handler exists.
                last = await client.call("VID-001", "param_get", {"name": "RTL_ALT"}, timeout_s=40)
                assert last.accepted, last
            finally:
                rc = await stop(proc)
            assert rc == 0
        assert kills == KILLS

        executed = [e for e in v.executions if e.command == SET_MODE and e.executed]
        modes = [e.params[1:3] for e in executed]
        twice = [i for i in range(1, len(modes)) if modes[i] == modes[i - 1]]
        assert twice == [], f"executed twice at {twice}: {modes}"
        assert len(executed) <= COMMANDS

    async def all_results() -> list[dict[str, object]] | None:
        got = [d for d in await cmd_results(provisioned) if d["cmd_id"] in set(ids)]
        return got if len({d["cmd_id"] for d in got}) == COMMANDS else None

    stored = await wait_for_async(all_results, 20, 0.2, what="a result per command")
    per_id = Counter(str(d["cmd_id"]) for d in stored)
    assert set(per_id.values()) == {1}, per_id.most_common(3)
    logs = "".join((tmp_path / f"gw{k}.log").read_text() for k in range(KILLS + 1))
    print("recoveries:", logs.count("command_in_flight_at_restart"),
          "results:", Counter(str(d["result"]) for d in stored))
