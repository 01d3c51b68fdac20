"""MAVLink 2 message signing, sans-IO: sign what we send, verify what we receive.

The MAVLink 2 signature is 13 bytes after the CRC: `link_id` (1), a 48-bit
timestamp in 10 µs units since 2015-01-01 UTC (6), and the first 6 bytes of
SHA-256(secret_key + header + payload + CRC + link_id + timestamp). Outgoing
frames are signed by pymavlink's own primitive (`MAVLink.signing`,
`sign_outgoing`); this module keeps the timestamp on the wall clock and
verifies incoming frames itself, because pymavlink's `check_signature`
records a stream's timestamp before it checks the signature (a forged frame
with a far-future timestamp would then block the genuine stream) and raises
instead of saying why a frame was refused.

Verification, as the specification and ArduPilot's C library do it:
- unsigned (or MAVLink 1) frames are refused, except RADIO_STATUS and RADIO,
  which a radio modem injects without the key (ArduPilot's accept list);
- the signature must match the key;
- per stream (sysid, compid, link_id) the timestamp must increase (a replay,
  even byte-exact, is refused); a stream seen for the first time is refused
  when its timestamp is more than 60 s behind our own;
- an accepted timestamp ahead of ours moves ours forward, so what we send
  stays acceptable to a peer whose clock runs ahead (ArduPilot starts 60 s
  ahead of the `initial_timestamp` it was given).

Cost: one SHA-256 over at most ~300 bytes per received frame, only on links
configured with a key (the framer does not call in here otherwise).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Final

from mavjet.contract.errors import ConfigError
from mavjet.drivers.mavlink.dialect import mavlink2

KEY_LEN: Final = 32
SIGNATURE_LEN: Final = 13
EPOCH_2015_S: Final = 1_420_070_400  # 2015-01-01T00:00:00Z, the signing timestamp's epoch
TICKS_PER_S: Final = 100_000  # the timestamp counts 10 µs ticks
NEW_STREAM_WINDOW_TICKS: Final = 60 * TICKS_PER_S
# Messages a radio modem sends on its own, without the key (ArduPilot's accept list).
UNSIGNED_ALLOWED: Final = frozenset({mavlink2.MAVLINK_MSG_ID_RADIO_STATUS, mavlink2.MAVLINK_MSG_ID_RADIO})


class Verdict(StrEnum):
    OK = "ok"
    UNSIGNED_ALLOWED = "unsigned_allowed"  # RADIO_STATUS / RADIO without a signature
    UNSIGNED = "unsigned"
    BAD_SIGNATURE = "bad_signature"
    REPLAY = "replay"  # timestamp not newer than the stream's last one
    STALE = "stale"  # a new stream more than 60 s behind our timestamp


@dataclass(slots=True)
class SigningStats:
    accepted: int = 0
    # Frames refused, by Verdict value (unsigned, bad_signature, replay, stale).
    rejected: dict[str, int] = field(default_factory=dict)


def parse_key(data: bytes, *, source: str = "signing_key_file") -> bytes:
    """A signing key file's content → the 32-byte key: 64 hex digits (whitespace ignored) or 32 raw bytes."""
    text = data.strip()
    if len(text) == 2 * KEY_LEN:
        try:
            return bytes.fromhex(text.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            pass
    if len(data) == KEY_LEN:
        return bytes(data)
    raise ConfigError(source, f"must hold a {KEY_LEN}-byte key: {2 * KEY_LEN} hex digits or {KEY_LEN} raw bytes")


def read_key_file(path: Path, *, source: str = "signing_key_file") -> bytes:
    """Read and parse a key file; an unreadable or malformed file is a ConfigError naming it."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(source, f"cannot read {path}: {exc.strerror or exc}") from exc
    return parse_key(data, source=f"{source} {path}")


def timestamp_ticks(wall_s: float) -> int:
    """Unix time (s) → signing timestamp (10 µs ticks since 2015-01-01 UTC)."""
    return int((wall_s - EPOCH_2015_S) * TICKS_PER_S)


def signature_fields(frame: bytes) -> tuple[int, int]:
    """(link_id, timestamp) of a signed MAVLink 2 frame."""
    return frame[-13], int.from_bytes(frame[-12:-6], "little")


class MavSigning:
    """One link's signing state: the key, our timestamp, and the timestamps of the streams we accepted.

    `attach(mav)` makes a pymavlink `MAVLink` object sign what it packs;
    call `before_send()` before each pack so the timestamp follows the clock.
    `verify(frame, msgid)` judges one CRC-valid received frame.
    """

    def __init__(self, key: bytes, *, link_id: int = 0, clock: Callable[[], float] = time.time) -> None:
        if len(key) != KEY_LEN:
            raise ConfigError("signing_key", f"must be {KEY_LEN} bytes, got {len(key)}")
        if not 0 <= link_id <= 255:
            raise ConfigError("signing.link_id", "must be 0..255")
        self.key = bytes(key)
        self.link_id = link_id
        self._clock = clock
        self.timestamp = timestamp_ticks(clock())
        self.streams: dict[tuple[int, int, int], int] = {}
        self.stats = SigningStats()
        self._state: Any = None  # pymavlink MAVLinkSigning of the attached MAVLink object

    def attach(self, mav: Any) -> None:
        st = mav.signing
        st.secret_key = self.key
        st.link_id = self.link_id
        st.sign_outgoing = True
        st.timestamp = self.timestamp
        self._state = st

    def before_send(self) -> None:
        """Advance the outgoing timestamp to now (pymavlink adds one per frame it signs)."""
        st = self._state
        ts = max(st.timestamp, self.timestamp, timestamp_ticks(self._clock()))
        st.timestamp = self.timestamp = ts

    def _reject(self, verdict: Verdict) -> Verdict:
        rejected = self.stats.rejected
        rejected[verdict.value] = rejected.get(verdict.value, 0) + 1
        return verdict

    def verify(self, frame: bytes, msgid: int) -> Verdict:
        """Judge one complete, CRC-valid frame (MAVLink 1 or 2)."""
        if frame[0] != 0xFD or not frame[2] & mavlink2.MAVLINK_IFLAG_SIGNED:
            if msgid in UNSIGNED_ALLOWED:
                return Verdict.UNSIGNED_ALLOWED
            return self._reject(Verdict.UNSIGNED)
        if hashlib.sha256(self.key + frame[:-6]).digest()[:6] != frame[-6:]:
            return self._reject(Verdict.BAD_SIGNATURE)
        ts = int.from_bytes(frame[-12:-6], "little")
        stream = (frame[5], frame[6], frame[-13])
        last = self.streams.get(stream)
        if last is None:
            ours = self._state.timestamp if self._state is not None else self.timestamp
            ours = max(ours, self.timestamp, timestamp_ticks(self._clock()))
            if ts + NEW_STREAM_WINDOW_TICKS < ours:
                return self._reject(Verdict.STALE)
        elif ts <= last:
            return self._reject(Verdict.REPLAY)
        self.streams[stream] = ts
        if ts > self.timestamp:
            self.timestamp = ts
            if self._state is not None and ts > self._state.timestamp:
                self._state.timestamp = ts
        self.stats.accepted += 1
        return Verdict.OK

    def accepts(self, frame: bytes, msgid: int) -> bool:
        """`verify` as the framer needs it: keep the frame or drop it."""
        v = self.verify(frame, msgid)
        return v is Verdict.OK or v is Verdict.UNSIGNED_ALLOWED


def setup_signing_message(key: bytes, *, target_system: int, target_component: int, wall_s: float) -> Any:
    """SETUP_SIGNING that provisions `key` with the current timestamp (an all-zero key and 0 disable signing)."""
    return mavlink2.MAVLink_setup_signing_message(
        target_system, target_component, key, timestamp_ticks(wall_s) if any(key) else 0
    )
