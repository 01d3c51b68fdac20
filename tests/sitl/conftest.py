"""Every scenario runs against each peer: the simulator in every `make test`, real ArduCopter SITL when ARDUCOPTER_BIN is set."""

from __future__ import annotations

import pytest

from tests.sitl.peers import SIM, SITL, Peer, sitl_missing


@pytest.fixture(params=["sim", "sitl"])
def peer(request: pytest.FixtureRequest) -> Peer:
    if request.param == "sitl":
        why = sitl_missing()
        if why is not None:
            pytest.skip(why)
        return SITL
    return SIM
