"""Untrusted command bodies never escape the decoder: 100,000+ random and mutated msgpack bodies (seeded, pure).

Whatever a publisher sends, the gateway's decode step (`spec.decode`: the
contract's body codec, the command's definition, the check against the
vehicle's mode table) returns a command or raises `CommandInvalid` with a
reason, never another exception: one that escaped would leave the message
unanswered and, with MaxAckPending 1, wedge the vehicle's queue.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import msgpack
import pytest

from mavjet.contract import envelope
from mavjet.contract.commands import (
    CATALOGUE,
    Command,
    CommandInvalid,
    encode_command,
    result_data,
)
from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.drivers.mavlink.modes import Flavour, ModeTable, VehicleClass
from mavjet.gateway.commands.spec import decode

SEED = 20261123
BODIES = 100_000
MAX = 64 * 1024
MODES = (
    ModeTable(flavour=Flavour.ARDUPILOT, vehicle_class=VehicleClass.COPTER),
    ModeTable(flavour=Flavour.PX4, vehicle_class=VehicleClass.COPTER),
    None,
)
VALID_PARAMS: dict[str, dict[str, Any]] = {
    "disarm": {"force": True},
    "takeoff": {"alt_m": 20.0},
    "set_mode": {"mode": "GUIDED"},
    "goto": {"lat_deg": -35.36, "lon_deg": 149.16, "alt_m": 30.0},
    "param_set": {"name": "RTL_ALT", "value": 1500.0},
    "param_get": {"name": "RTL_ALT"},
    "mission_upload": {"object": "missions/survey.plan"},
}
# Bytes that start msgpack types with lengths or ext payloads: where decoders break.
INTERESTING = bytes([0xC0, 0xC1, 0xC2, 0xC3, 0xC4, 0xC7, 0xC9, 0xCA, 0xCB, 0xCF, 0xD3, 0xD4, 0xD6, 0xD7, 0xD8,
                     0xD9, 0xDB, 0xDC, 0xDD, 0xDE, 0xDF, 0x80, 0x81, 0x8F, 0x90, 0x91, 0x9F, 0xA0, 0xBF, 0xFF])


@dataclass
class State:
    armed: bool | None = True
    mode: str | None = "GUIDED"
    failsafe_active: bool = False
    landed_state: int | None = mavlink2.MAV_LANDED_STATE_ON_GROUND
    flavour: str = "ardupilot"
    vehicle_class: str = "copter"
    modes: ModeTable | None = MODES[0]


class Gen:
    def __init__(self, rng: random.Random) -> None:
        self.r = rng

    def scalar(self) -> Any:
        r = self.r
        return r.choice((
            lambda: None, lambda: r.random() < 0.5, lambda: r.randint(-(2**63), 2**64 - 1), lambda: r.randint(-40, 600),
            lambda: r.choice((math.nan, math.inf, -math.inf, -0.0, 1e308, 5e-324, r.uniform(-1e3, 1e3))),
            lambda: "".join(r.choice("AZaz09_.-/ \n\x00é€😀") for _ in range(r.randint(0, 20))),
            lambda: r.randbytes(r.randint(0, 12)),
            lambda: msgpack.Timestamp(r.randint(-(2**34), 2**34), r.randint(0, 999_999_999)),
            lambda: msgpack.ExtType(r.randint(0, 127), r.randbytes(r.choice((0, 1, 4, 8, 12, 5)))),
            lambda: r.choice(("id", "issued", "deadline", "params", "issuer", "alt_m", "mode", "name", "force")),
        ))()

    def value(self, depth: int = 0) -> Any:
        r = self.r
        roll = r.random()
        if depth > 3 or roll < 0.6:
            return self.scalar()
        if roll < 0.75:
            return [self.value(depth + 1) for _ in range(r.randint(0, 4))]
        if roll < 0.8:  # a tuple packs as an array: as a map key it is the `81 91 01 01` family
            return tuple(self.scalar() for _ in range(r.randint(0, 3)))
        return {self.key(): self.value(depth + 1) for _ in range(r.randint(0, 4))}

    def key(self) -> Any:
        r = self.r
        if r.random() < 0.15:
            return tuple(self.scalar() for _ in range(r.randint(0, 2)))
        k = self.scalar()
        return k if isinstance(k, str | int | float | bool | bytes | type(None)) else str(k)

    def structured(self, name: str) -> bytes:
        """A map shaped like a command body, with some fields wrong in type or value."""
        r = self.r
        body: dict[Any, Any] = {}
        if r.random() < 0.9:
            body["id"] = r.choice((f"c{r.randint(0, 10**6)}", self.scalar()))
        if r.random() < 0.9:
            body["issued"] = r.choice((msgpack.Timestamp.from_unix_nano(time.time_ns()), self.scalar()))
        if r.random() < 0.3:
            body["deadline"] = self.scalar()
        if r.random() < 0.3:
            body["issuer"] = self.scalar()
        if r.random() < 0.9:
            params = dict(VALID_PARAMS.get(name, {}))
            for _ in range(r.randint(0, 3)):
                params[r.choice((*params, self.key()) if params else (self.key(),))] = self.value(1)
            body["params"] = r.choice((params, params, self.value()))
        if r.random() < 0.1:
            body[self.key()] = self.value()
        packed: bytes = msgpack.packb(body, use_bin_type=True)
        return packed

    def mutated(self, name: str) -> bytes:
        r = self.r
        buf = bytearray(encode_command(f"m{r.randint(0, 10**6)}", VALID_PARAMS.get(name, {}),
                                       issued_ns=time.time_ns(), deadline_ns=r.choice((None, time.time_ns()))))
        for _ in range(r.randint(1, 4)):
            op = r.randrange(6)
            i = r.randrange(len(buf) + 1)
            if op == 0 and buf:
                buf[min(i, len(buf) - 1)] ^= 1 << r.randrange(8)
            elif op == 1:
                buf[i:i] = r.randbytes(r.randint(1, 4))
            elif op == 2:
                del buf[i:i + r.randint(1, 8)]
            elif op == 3:
                del buf[i:]
            elif op == 4 and buf:
                buf[min(i, len(buf) - 1)] = r.choice(INTERESTING)
            else:
                j = r.randrange(len(buf) + 1)
                buf[i:i] = buf[min(i, j):max(i, j)][:32]
        return bytes(buf)

    def body(self, name: str) -> bytes:
        r = self.r
        kind = r.random()
        if kind < 0.15:
            return r.randbytes(r.randint(0, 40))
        if kind < 0.2:  # a few bytes of interesting type markers: short, deep or wrong-keyed containers
            return bytes(r.choice(INTERESTING) if r.random() < 0.6 else r.randrange(256) for _ in range(r.randint(1, 8)))
        if kind < 0.55:
            return self.structured(name)
        return self.mutated(name)


def check_one(name: str, payload: bytes, modes: ModeTable | None, max_bytes: int) -> str:
    """Decode as the executor does; returns how it ended. Any exception but CommandInvalid fails the test."""
    try:
        cmd, defn = decode(name, payload, modes, max_payload_bytes=max_bytes, fallback_id="hdr-1")
    except CommandInvalid as exc:
        assert exc.reason and len(exc.reason) < 2000, exc.reason
        assert isinstance(exc.cmd_id, str) and exc.cmd_id, exc.cmd_id
        # What the executor then builds from it must not fail either.
        envelope.pack("VID-001", 0, result_data(cmd_id=exc.cmd_id, name=name, result="invalid", detail=exc.reason))
        return "invalid"
    assert isinstance(cmd, Command) and cmd.name == name == defn.name
    assert isinstance(cmd.cmd_id, str) and isinstance(cmd.issued_ns, int)
    defn.failure(cmd, State(modes=modes))
    cmd.expired(time.time_ns())
    envelope.pack("VID-001", 0, result_data(cmd_id=cmd.cmd_id, name=name, result="accepted"))
    return "ok"


KNOWN_BAD = [
    bytes.fromhex("81910101"),  # {[1]: 1}: a map whose key is an array (TypeError in msgpack)
    bytes.fromhex("81800101"),  # {{}: 1}: a map key that is a map
    b"\x91" * 5000,  # 5000 nested arrays (StackError)
    bytes.fromhex("c705ff0000000000"),  # a timestamp ext of 5 bytes
    bytes.fromhex("a2c328"),  # invalid UTF-8 in a str
    bytes.fromhex("dfffffffff"),  # a map announcing 4 billion entries
    msgpack.packb({"id": "a\r\nNats-Msg-Id: x", "issued": msgpack.Timestamp(0, 0)}),  # a header injection
    msgpack.packb({"id": "bad-deep", "issued": msgpack.Timestamp(0, 0), "params": {"alt_m": [[[[[[[[1]]]]]]]]}}),
    msgpack.packb({"id": "bad-newline", "issued": msgpack.Timestamp(0, 0), "params": {"mode": "GUIDED\n"}}),
]


@pytest.mark.parametrize("payload", KNOWN_BAD, ids=lambda b: b[:6].hex())
def test_known_bad_bodies_are_invalid(payload: bytes) -> None:
    for name in ("land", "takeoff", "set_mode"):
        assert check_one(name, payload, MODES[0], MAX) == "invalid"


def test_the_wedging_body_gets_a_reason() -> None:
    with pytest.raises(CommandInvalid) as exc:
        decode("land", bytes.fromhex("81910101"), None, max_payload_bytes=MAX, fallback_id="hdr-1")
    assert exc.value.reason == "land: body is not msgpack (unhashable type: 'list')"
    assert exc.value.cmd_id == "hdr-1"


def test_random_and_mutated_bodies_never_escape() -> None:
    rng = random.Random(SEED)
    gen = Gen(rng)
    names = [*CATALOGUE, "selfdestruct", "", "land.x", "é"]
    outcomes: Counter[str] = Counter()
    t0 = time.monotonic()
    for i in range(BODIES):
        name = rng.choice(names) if rng.random() < 0.2 else rng.choice(list(CATALOGUE))
        payload = gen.body(name)
        max_bytes = MAX if rng.random() < 0.98 else rng.randint(1, 64)
        try:
            outcomes[check_one(name, payload, rng.choice(MODES), max_bytes)] += 1
        except AssertionError:
            raise
        except Exception as exc:  # report the body that escaped, reproducibly
            raise AssertionError(f"body #{i} for {name!r} escaped: {type(exc).__name__}: {exc}; "
                                 f"payload={payload.hex()}") from exc
    elapsed_s = time.monotonic() - t0
    assert sum(outcomes.values()) == BODIES
    # The mix reaches both ends: some bodies decode (so the deep checks ran), most do not.
    assert outcomes["ok"] > 1000 and outcomes["invalid"] > BODIES // 2, outcomes
    assert elapsed_s < 60, f"{BODIES} bodies took {elapsed_s:.1f} s"
