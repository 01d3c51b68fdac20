"""The simulator's port layout (SITL's: base + 10*i) for fleets too large for the preferred base."""

from __future__ import annotations

import socket

from gateway.ops.demo import pick_base_port


def test_a_fleet_too_large_for_the_preferred_base_gets_a_lower_one() -> None:
    n = 4001  # 40,010 ports: 25760 + that is past 65535
    base = pick_base_port(n, preferred=25760)
    assert base != 25760 and base >= 1024 and base + 10 * n < 65535
    with socket.socket() as s:  # the range's ports are free to bind
        s.bind(("127.0.0.1", base + 10 * (n - 1)))


def test_the_preferred_base_is_kept_when_it_fits() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if port + 30 < 65535:
        assert pick_base_port(3, preferred=port) == port
