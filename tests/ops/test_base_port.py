"""The simulator's port layout (SITL's: base + 10*i) for fleets too large for the preferred base."""

from __future__ import annotations

import socket

from mavjet.ops.demo import pick_base_port


def test_a_fleet_too_large_for_the_preferred_base_gets_a_lower_one() -> None:
    n = 4001  # 40,010 ports: 25760 + that is past 65535
    # Ports in use in the ephemeral range end in any digit; here every one ending in 0 or 1 is taken.
    busy = {p for p in range(32768, 61000) if p % 10 in (0, 1)}
    base = pick_base_port(n, preferred=25760, is_free=lambda p: p not in busy)
    assert base != 25760 and base >= 1024 and base + 10 * n < 65535
    assert not busy & {base + 10 * i for i in range(n)}


def test_the_preferred_base_is_kept_when_it_fits_and_is_free() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if port + 30 < 65535:
        assert pick_base_port(3, preferred=port) == port  # the real check: nothing listens there now


def test_a_listening_port_is_not_free() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert pick_base_port(1, preferred=port) != port
