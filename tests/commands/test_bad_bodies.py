"""A malformed body never wedges a vehicle's queue: real nats-server, real sim, in-process gateway.

Each bad body gets its `invalid` result with a reason and is terminated, and
the vehicle's next command (published right behind it) still runs within
seconds, instead of waiting for AckWait x MaxDeliver behind an unanswered
message (MaxAckPending 1).
"""

from __future__ import annotations

import time
from pathlib import Path

from nats.aio.client import Client

from mavjet.contract.commands import CommandInvalid
from mavjet.gateway.commands.spec import decode
from mavjet.ops.natsserver import NatsServer
from tests.commands.test_fuzz_bodies import KNOWN_BAD, MAX
from tests.support.commands import command_rig, consumer_idle, dispositions_settled

NEXT_WITHIN_S = 5.0


def expected_id(name: str, payload: bytes, msg_id: str) -> str:
    """The id the gateway's result will carry: the body's if it could be read, else the Nats-Msg-Id."""
    try:
        decode(name, payload, None, max_payload_bytes=MAX, fallback_id=msg_id)
    except CommandInvalid as exc:
        assert exc.cmd_id is not None
        return exc.cmd_id
    raise AssertionError(f"{payload[:16].hex()} decodes")


async def test_next_command_runs_within_seconds_after_each_bad_body(
    provisioned: Client, nats_server: NatsServer, tmp_path: Path
) -> None:
    async with command_rig(provisioned, nats_server.url, tmp_path / "state") as rig:
        await rig.link_known("VID-001")
        c = rig.client
        for i, payload in enumerate(KNOWN_BAD):
            msg_id = f"bad-{i}"
            bad_id = expected_id("land", payload, msg_id)
            c.expect(bad_id)
            await c.publish_raw("VID-001", "land", payload, msg_id=msg_id)
            t0 = time.monotonic()
            good = await c.call("VID-001", "param_get", {"name": "RTL_ALT"}, timeout_s=NEXT_WITHIN_S)
            took_s = time.monotonic() - t0
            bad = await c.wait(bad_id, 1.0)  # ended before the command behind it
            assert bad.result == "invalid" and bad.detail.startswith("land: "), (payload[:16].hex(), bad)
            assert good.accepted, (payload[:16].hex(), good)
            assert took_s < NEXT_WITHIN_S, (payload[:16].hex(), took_s)
        info = await consumer_idle(provisioned, "VID-001")
        assert not info.num_redelivered  # every bad body was terminated at its first delivery
        done = await dispositions_settled(rig, "VID-001", 2 * len(KNOWN_BAD))
        assert done == {"term": len(KNOWN_BAD), "ack": len(KNOWN_BAD)}
        # The phase histogram: a body that does not decode has only its `result` phase; a command sent
        # to the vehicle has all four (`queue` needs the body's `issued` stamp).
        count = rig.gw.metrics.registry.get_sample_value
        phases = {ph: count("mavjet_command_phase_seconds_count", {"phase": ph})
                  for ph in ("queue", "ledger", "vehicle", "result")}
        n = len(KNOWN_BAD)
        assert phases == {"queue": n, "ledger": n, "vehicle": n, "result": 2 * n}, phases
