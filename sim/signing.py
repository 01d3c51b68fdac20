"""MAVLink 2 signing as ArduPilot does it, for the simulated vehicle (sans-IO).

The sim is the gateway's test peer, so this is its own implementation from
the MAVLink 2 specification, not the gateway's (drivers/mavlink/signing.py).
What ArduCopter was seen to do (ArduCopter 4.7 SITL, with two ground links):

- SETUP_SIGNING is accepted silently (no ACK, no STATUSTEXT); from the next
  frame on every frame on every link is signed, `link_id` = the link number
  (0 for SERIAL0, 1 for SERIAL1). Each link's first timestamp is
  initial_timestamp + 6,000,000 (ArduPilot starts a minute ahead, against
  replays after a reboot), then +1 per frame on that link; it does not
  follow the wall clock.
- Received frames: a good signature with a timestamp newer than the last of
  its (sysid, compid, link_id) stream is accepted (a stream seen for the first
  time may be up to 60 s behind the link's own timestamp); an accepted
  timestamp ahead of the link's own moves it forward.
- Link 0 (SERIAL0, the "USB" port) accepts anything even with signing on:
  unsigned, wrong key and replayed frames alike (ArduPilot's accept-unsigned
  callback always says yes for channel 0). Other links accept unsigned only
  RADIO_STATUS and RADIO; everything else unsigned, badly signed or replayed
  is ignored without an answer.
- SETUP_SIGNING with an all-zero key and timestamp 0 turns signing off.
- The key and timestamp survive a reboot; the timestamp comes back a minute
  ahead of the last one used.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from fastcrc.crc16 import mcrf4xx as _crc
from pymavlink.dialects.v20 import ardupilotmega as mavlink2

SIGNED_FLAG: Final = 0x01
AHEAD_TICKS: Final = 60 * 100_000  # 60 s in 10 µs ticks
_UNSIGNED_OK: Final = frozenset({mavlink2.MAVLINK_MSG_ID_RADIO_STATUS, mavlink2.MAVLINK_MSG_ID_RADIO})
_CRC: Final = struct.Struct("<H")


class Check(StrEnum):
    SIGNED = "signed"  # good signature, newer timestamp
    ACCEPTED_UNSIGNED = "accepted_unsigned"  # link 0, or RADIO_STATUS/RADIO
    UNSIGNED = "unsigned"
    BAD_SIGNATURE = "bad_signature"
    REPLAY = "replay"


@dataclass(slots=True)
class SigningCounters:
    accepted_signed: int = 0
    accepted_unsigned: int = 0  # let through by the link-0 / radio rule while signing is on
    ignored: dict[str, int] = field(default_factory=dict)  # by Check value


class VehicleSigning:
    """One vehicle's signing state across its links."""

    def __init__(self) -> None:
        self.key: bytes | None = None
        self._initial = 0
        self.link_ts: dict[int, int] = {}  # the next timestamp to sign with, per link id
        self.streams: dict[tuple[int, int, int], int] = {}
        self.counters = SigningCounters()

    @property
    def enabled(self) -> bool:
        return self.key is not None

    def setup(self, key: bytes, initial_timestamp: int) -> None:
        """Apply a SETUP_SIGNING (all-zero key and timestamp 0: off)."""
        if initial_timestamp == 0 and not any(key):
            self.key = None
            self.link_ts.clear()
            return
        self.key = bytes(key)
        self._initial = initial_timestamp + AHEAD_TICKS
        self.link_ts.clear()

    def rebooted(self) -> None:
        """After a reboot every link starts a minute past the newest timestamp used."""
        newest = max([self._initial, *self.link_ts.values()])
        self._initial = newest + AHEAD_TICKS
        self.link_ts.clear()
        self.streams.clear()

    def _next_ts(self, link_id: int) -> int:
        ts = self.link_ts.get(link_id, self._initial)
        self.link_ts[link_id] = ts + 1
        return ts

    def sign(self, frame: bytes, link_id: int) -> bytes:
        """Sign one unsigned MAVLink 2 frame for `link_id` (sets the flag, so the CRC is recomputed)."""
        key = self.key
        if key is None or frame[0] != 0xFD:
            return frame
        msgid = frame[7] | frame[8] << 8 | frame[9] << 16
        body = bytearray(frame[:-2])
        body[2] |= SIGNED_FLAG
        crc_extra = mavlink2.mavlink_map[msgid].crc_extra
        body += _CRC.pack(_crc(bytes(body[1:]) + bytes((crc_extra,)), 0xFFFF))
        body.append(link_id)
        body += self._next_ts(link_id).to_bytes(6, "little")
        body += hashlib.sha256(key + bytes(body)).digest()[:6]
        return bytes(body)

    def check(self, frame: bytes, msgid: int, link_id: int) -> Check:
        """Judge one received frame on link `link_id` (only called while signing is on)."""
        key = self.key
        assert key is not None
        verdict = self._verify(frame, key, link_id)
        if verdict is Check.SIGNED:
            self.counters.accepted_signed += 1
            return verdict
        if link_id == 0 or msgid in _UNSIGNED_OK:
            self.counters.accepted_unsigned += 1
            return Check.ACCEPTED_UNSIGNED
        ignored = self.counters.ignored
        ignored[verdict.value] = ignored.get(verdict.value, 0) + 1
        return verdict

    def _verify(self, frame: bytes, key: bytes, link_id: int) -> Check:
        if frame[0] != 0xFD or not frame[2] & SIGNED_FLAG or len(frame) < 25:
            return Check.UNSIGNED
        if hashlib.sha256(key + frame[:-6]).digest()[:6] != frame[-6:]:
            return Check.BAD_SIGNATURE
        ts = int.from_bytes(frame[-12:-6], "little")
        stream = (frame[5], frame[6], frame[-13])  # the sender's (sysid, compid, link_id)
        last = self.streams.get(stream)
        ours = self.link_ts.get(link_id, self._initial)  # the receiving link's own timestamp
        if (last is None and ts + AHEAD_TICKS < ours) or (last is not None and ts <= last):
            return Check.REPLAY
        self.streams[stream] = ts
        if ts > ours:
            self.link_ts[link_id] = ts
        return Check.SIGNED
