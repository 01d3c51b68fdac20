"""What the gateway really publishes in a sortie is what the event catalogue (contract/events.py) says.

A simulated vehicle is flown through TWIN_CMD (the demo's sortie), the
gateway stops, and every event it stored in TWIN_EVENTS is held to the
catalogue: a published type, the fields its entry promises, no key its entry
does not know, and each accepted command confirmed by the event that the
catalogue says confirms it.
"""

from __future__ import annotations

from pathlib import Path

from nats.aio.client import Client

from mavjet.contract.commands import CommandName
from mavjet.contract.events import EFFECTS, PUBLISHED, SNAPSHOT_FIELDS, EventType, spec
from mavjet.ops.natsserver import NatsServer
from mavjet.ops.sortie import SortiePlan, fly_sortie
from mavjet.sim.fleet import SimConfig
from tests.support.commands import ENV, command_rig
from tests.support.gateway import collect_events
from tests.support.wait import wait_for


def catalogue_problems(events: list[tuple[str, str, dict[str, object], str]]) -> list[str]:
    """Every way the stored events disagree with the catalogue, one line each."""
    published = {t.value for t in PUBLISHED}
    problems: list[str] = []
    for _vid, etype, data, msg_id in events:
        if etype not in published:
            problems.append(f"{msg_id}: type {etype!r} is not a published catalogue type")
            continue
        entry = spec(etype)
        missing = set(entry.fields) - set(data)
        if missing:
            problems.append(f"{msg_id}: {etype} lacks {sorted(missing)}")
        extra = set(data) - set(SNAPSHOT_FIELDS) - set(entry.fields) - set(entry.optional)
        if extra and not entry.more:
            problems.append(f"{msg_id}: {etype} carries {sorted(extra)} the catalogue does not list")
    return problems


def test_catalogue_problems_can_fail() -> None:
    events: list[tuple[str, str, dict[str, object], str]] = [
        ("V", "landing", {}, "a"), ("V", "landed", {"max_alt_m": 1.0}, "b"),
        ("V", "armed", {"armed": True, "why": "x"}, "c"), ("V", "cmd_result", {}, "d"),
    ]
    assert catalogue_problems(events) == [
        "a: type 'landing' is not a published catalogue type",
        "b: landed lacks ['distance_m', 'flight_s']",
        "c: armed carries ['why'] the catalogue does not list",
        "d: cmd_result lacks ['attempts', 'cmd_id', 'detail', 'latency_ms', 'mav_result', 'name', 'result']",
    ]


async def test_a_sortie_publishes_only_catalogued_events(
    provisioned: Client, nats_server: NatsServer, tmp_path: Path
) -> None:
    sim = SimConfig(vehicles=1, base_port=0, speedup=20.0)
    async with command_rig(provisioned, nats_server.url, tmp_path / "state", sim=sim) as rig:
        plan = SortiePlan(alt_m=10.0, radius_m=20.0, step_timeout_s=40.0)
        results = await fly_sortie(provisioned, ENV, "VID-001", plan, client=rig.client)
        assert all(r.accepted for r in results)
        # The sortie reads armed from the state stream, which can lag the twin: the gateway must have
        # seen the landing and the disarm before it stops.
        model = rig.gw.twins["VID-001"].model
        await wait_for(lambda: model.armed is False, timeout_s=40, what="the twin disarmed")
    events = await collect_events(provisioned)  # after the gateway stopped: gateway_stopped is in
    assert not catalogue_problems(events), "\n".join(catalogue_problems(events))
    types = [etype for _vid, etype, _data, _id in events]
    flown = {EventType.GATEWAY_STARTED, EventType.MODE_CHANGED, EventType.ARMED, EventType.TAKEOFF,
             EventType.LANDED, EventType.DISARMED, EventType.CMD_RESULT, EventType.GATEWAY_STOPPED}
    assert flown <= set(types), f"missing {flown - set(types)} in {types}"
    # Each accepted command the catalogue gives an effect is confirmed by that effect, stored after the
    # result of the command before it: the sortie sends one command at a time, but the effect may be
    # stored before its own result (the vehicle's HEARTBEAT can beat its COMMAND_ACK, and an event
    # reaches the stream through the spool while a result may go straight to it).
    previous_result = -1
    for i, (_vid, etype, data, msg_id) in enumerate(events):
        if etype != EventType.CMD_RESULT:
            continue
        effect = EFFECTS.get(CommandName(str(data["name"])))
        if data["result"] == "accepted" and effect is not None:
            assert effect[0] in types[previous_result + 1:], f"{data['name']} ({msg_id}) is never confirmed by {effect[0]}"
        previous_result = i
