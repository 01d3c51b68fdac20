"""A tiny sd_notify client: READY, WATCHDOG, STOPPING and STATUS for systemd.

Why not a dependency: the protocol is one datagram per state change to the
unix socket named in NOTIFY_SOCKET, which is a dozen lines; the `systemd`
Python bindings need libsystemd and a compiler on a companion computer.

Rules this client keeps, so the daemon can call it from anywhere:
- absent NOTIFY_SOCKET (not under systemd, tests, containers) makes every call
  a no-op that returns False;
- the socket is non-blocking: a full receive queue drops the datagram instead
  of stalling the event loop;
- it never raises into the caller: failures are logged once per kind and
  counted in `errors`.

The watchdog interval is half of WATCHDOG_USEC, as sd_watchdog_enabled(3)
recommends, and only when WATCHDOG_PID is absent or names this process (a
forked helper must not ping for its parent).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


def _address(raw: str) -> str | bytes | None:
    """NOTIFY_SOCKET value -> an address for sendto; '@name' is the abstract namespace."""
    if not raw:
        return None
    if raw.startswith("@"):
        return b"\0" + raw[1:].encode()
    if raw.startswith("/"):
        return raw
    # vsock:... and other schemes are not used on companion computers.
    return None


@dataclass(slots=True, kw_only=True)
class Notifier:
    """Sends sd_notify datagrams; a no-op when `address` is None."""

    address: str | bytes | None = None
    watchdog_usec: int | None = None
    sent: int = 0
    errors: int = 0
    _sock: socket.socket | None = field(default=None, repr=False)
    _logged: set[str] = field(default_factory=set, repr=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Notifier:
        """Read NOTIFY_SOCKET, WATCHDOG_USEC and WATCHDOG_PID (default: os.environ)."""
        env = os.environ if environ is None else environ
        address = _address(env.get("NOTIFY_SOCKET", ""))
        usec: int | None = None
        raw_usec = env.get("WATCHDOG_USEC", "")
        raw_pid = env.get("WATCHDOG_PID", "")
        pid_ok = not raw_pid or (raw_pid.isdigit() and int(raw_pid) == os.getpid())
        if raw_usec.isdigit() and int(raw_usec) > 0 and pid_ok:
            usec = int(raw_usec)
        return cls(address=address, watchdog_usec=usec)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    @property
    def watchdog_interval_s(self) -> float | None:
        """How often to call `watchdog()`: half the unit's WatchdogSec, or None if off."""
        if self.watchdog_usec is None or self.address is None:
            return None
        return self.watchdog_usec / 2_000_000

    def ready(self) -> bool:
        return self.notify("READY=1")

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def stopping(self) -> bool:
        return self.notify("STOPPING=1")

    def reloading(self) -> bool:
        return self.notify("RELOADING=1")

    def status(self, text: str) -> bool:
        # One line: systemd shows STATUS in `systemctl status`; a newline would start a new field.
        return self.notify("STATUS=" + " ".join(text.split()))

    def notify(self, message: str) -> bool:
        """Send one datagram; True if the kernel took it."""
        if self.address is None:
            return False
        try:
            if self._sock is None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                sock.setblocking(False)
                self._sock = sock
            self._sock.sendto(message.encode(), self.address)
        except OSError as exc:
            self.errors += 1
            kind = type(exc).__name__
            if kind not in self._logged:
                self._logged.add(kind)
                log.warning("sd_notify %s failed: %s (further %s errors are only counted)", message, exc, kind)
            return False
        self.sent += 1
        return True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
