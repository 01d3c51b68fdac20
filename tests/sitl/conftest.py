"""Every scenario runs against each peer: the simulator in every `make test`, real ArduCopter SITL when ARDUCOPTER_BIN
is set, real PX4 SITL (SIH) when PX4_BIN is set."""

from __future__ import annotations

import pytest

from tests.sitl.peers import PX4, SIM, SITL, Peer, px4_missing, sitl_missing


@pytest.fixture(params=["sim", "sitl", "px4"])
def peer(request: pytest.FixtureRequest) -> Peer:
    if request.param == "sitl":
        why = sitl_missing()
        if why is not None:
            pytest.skip(why)
        return SITL
    if request.param == "px4":
        why = px4_missing()
        if why is not None:
            pytest.skip(why)
        return PX4
    return SIM
