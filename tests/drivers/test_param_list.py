"""Unknown parameters on an autopilot that does not answer them (ArduPilot up to 4.7, the sim's ArduPilot flavour):
the session fetches the vehicle's parameter list once on the first miss, then knows (drivers/mavlink/paramlist.py);
PX4 (and ArduPilot 4.8) say so themselves with PARAM_ERROR."""

from __future__ import annotations

import time

import pytest

from mavjet.drivers.mavlink.paramlist import ParamDirectory, ParamNotListed
from mavjet.drivers.mavlink.params import ParamTimeout, ParamUnknown
from tests.drivers.test_session_sim import sim_session


async def test_an_unknown_name_is_known_unknown_from_the_list_and_later_ones_fail_at_once() -> None:
    async with sim_session() as (session, v, _model):
        with pytest.raises(ParamNotListed) as first:
            await session.read_param("NO_SUCH_PARAM")
        assert isinstance(first.value, ParamUnknown) and isinstance(first.value, ParamTimeout)  # shadow: unknown
        assert f"not among its {len(v.params)} listed" in str(first.value), str(first.value)
        t0 = time.monotonic()
        with pytest.raises(ParamNotListed):
            await session.set_param("ALSO_NOT_A_PARAM", 1.0)
        assert time.monotonic() - t0 < 0.5  # no read sent: the list is fresh
        assert (await session.read_param("RTL_ALT")).value == v.params["RTL_ALT"]  # known names still read


async def test_px4_says_unknown_itself_without_a_list() -> None:
    async with sim_session("px4") as (session, _v, _model):
        t0 = time.monotonic()
        with pytest.raises(ParamUnknown) as err:
            await session.read_param("NO_SUCH_PARAM")
        assert not isinstance(err.value, ParamNotListed) and err.value.error == 1
        assert time.monotonic() - t0 < 1.0


def test_the_directory_goes_stale_on_another_count_or_connection() -> None:
    d = ParamDirectory()
    assert d.lacks("X", 1) is None  # never fetched: nothing known
    d.store(frozenset({"A", "B"}), 2, connection=1)
    assert d.lacks("A", 1) is None and isinstance(d.lacks("X", 1), ParamNotListed)
    assert d.lacks("X", 2) is None  # a new connection: maybe another vehicle, or rebooted
    d.seen(2)
    assert d.fresh(1)
    d.seen(3)  # a PARAM_VALUE counting 3 parameters: the set grew
    assert not d.fresh(1) and d.lacks("X", 1) is None
