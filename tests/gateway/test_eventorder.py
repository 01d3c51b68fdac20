"""The bookkeeping that lets a command result skip the spool (gateway/publish/eventorder.py): pure, no I/O."""

from __future__ import annotations

from mavjet.contract.subjects import event_subject
from mavjet.gateway.publish.eventorder import EventsOnTheWay


def s(vid: str, etype: str = "statustext") -> str:
    return event_subject("prod", vid, etype)


def test_nothing_skips_until_the_spool_was_seen_empty() -> None:
    ways = EventsOnTheWay()
    assert not ways.clear(s("V1", "cmd_result"))  # what an earlier run spooled is not known yet
    ways.settle(spool_empty=False, queue_empty=True)
    assert not ways.clear(s("V1", "cmd_result"))
    ways.settle(spool_empty=True, queue_empty=True)
    assert ways.clear(s("V1", "cmd_result")) and ways.known


def test_a_vehicle_with_an_event_on_the_way_waits_and_others_do_not() -> None:
    ways = EventsOnTheWay()
    ways.settle(spool_empty=True, queue_empty=True)
    ways.handed(s("V1", "mode_changed"))
    ways.handed(s("V1", "statustext"))
    assert not ways.clear(s("V1", "cmd_result")) and ways.clear(s("V2", "cmd_result"))
    ways.sent([s("V1", "mode_changed")])
    assert not ways.clear(s("V1", "cmd_result")) and len(ways) == 1
    ways.sent([s("V1", "statustext"), s("V1", "statustext")])  # one more than counted: never below zero
    assert ways.clear(s("V1", "cmd_result")) and len(ways) == 0
    ways.handed(s("V1"))
    assert not ways.clear(s("V1", "cmd_result"))


def test_a_dropped_event_keeps_its_vehicle_waiting_until_the_spool_empties() -> None:
    ways = EventsOnTheWay()
    ways.settle(spool_empty=True, queue_empty=True)
    ways.handed(s("V1"))  # dropped by the spool over its bound: never sent, still counted
    ways.settle(spool_empty=False, queue_empty=True)
    assert not ways.clear(s("V1", "cmd_result"))
    ways.settle(spool_empty=True, queue_empty=False)  # something still queued for the spool: no reset
    assert not ways.clear(s("V1", "cmd_result"))
    ways.settle(spool_empty=True, queue_empty=True)
    assert ways.clear(s("V1", "cmd_result"))


def test_subjects_outside_the_fleet_count_as_one_unnamed_vehicle() -> None:
    ways = EventsOnTheWay()
    ways.settle(spool_empty=True, queue_empty=True)
    ways.handed("elsewhere.x")
    assert not ways.clear("elsewhere.y") and ways.clear(s("V1", "cmd_result"))
