"""The error family shared by the whole project.

Every error carries its data in attributes so callers branch on fields, not on
message text. Third-party exceptions (OSError, serial.SerialException,
nats.errors.*) are translated into these at the boundary that calls them.
"""

from __future__ import annotations


class MavjetError(Exception):
    """Base of every error mavjet raises on purpose."""


class LinkError(MavjetError):
    """A transport to an autopilot failed or is closed."""

    def __init__(self, endpoint: str, reason: str) -> None:
        super().__init__(f"link {endpoint}: {reason}")
        self.endpoint = endpoint
        self.reason = reason


class NotOwnerError(LinkError):
    """A frame that acts was not sent: this gateway does not own the vehicle now (a standby, or fenced)."""


class ProtocolError(MavjetError):
    """The peer broke a MAVLink protocol (wrong sequence, bad item, bad CRC)."""

    def __init__(self, protocol: str, reason: str) -> None:
        super().__init__(f"{protocol}: {reason}")
        self.protocol = protocol
        self.reason = reason


class CommandRejected(MavjetError):
    """The autopilot answered a command with a MAV_RESULT other than ACCEPTED."""

    def __init__(self, command: int, result: int, detail: str = "") -> None:
        super().__init__(f"command {command} rejected with MAV_RESULT {result} {detail}".strip())
        self.command = command
        self.result = result
        self.detail = detail


class CommandTimeout(MavjetError):
    """No COMMAND_ACK arrived after every retry."""

    def __init__(self, command: int, attempts: int) -> None:
        super().__init__(f"command {command}: no COMMAND_ACK after {attempts} attempts")
        self.command = command
        self.attempts = attempts


class ConfigError(MavjetError):
    """Configuration is invalid; `key` names the offending setting."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"config {key}: {reason}")
        self.key = key
        self.reason = reason
