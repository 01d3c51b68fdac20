"""Subject and key names from the design contract (docs/design.md, Subjects).

All subjects are built here so the contract lives in one file.
"""

from __future__ import annotations

import re

from mavjet.contract.errors import ConfigError
from mavjet.contract.events import PUBLISHED

STATE_STREAM = "TWIN_STATE"
EVENTS_STREAM = "TWIN_EVENTS"
CMD_STREAM = "TWIN_CMD"
SHADOW_BUCKET = "TWIN_SHADOW"
BLOBS_BUCKET = "TWIN_BLOBS"
LOGS_STREAM = "TWIN_LOGS"  # flight logs, under each vehicle's own subjects (docs/design.md, "Flight logs")
TRACKS_STREAM = "TWIN_TRACKS"  # the flight recorder's track, one subject per vehicle

STATE_CHANNELS = ("position", "attitude", "battery", "gps", "status", "link")

# The published event types (the catalogue, contract/events.py, is where each is defined).
EVENT_TYPES: frozenset[str] = frozenset(t.value for t in PUBLISHED)

# A subject token: no dots, wildcards or whitespace. Kept strict so a vid can
# never widen a subscription or escape its vehicle's namespace.
_TOKEN = re.compile(r"^[A-Za-z0-9_\-]+$")


def check_token(kind: str, value: str) -> str:
    """Return `value` if it is a valid single subject token, else raise ConfigError."""
    if not _TOKEN.match(value):
        raise ConfigError(kind, f"{value!r} is not a valid subject token (letters, digits, - and _)")
    return value


def veh_prefix(env: str, vid: str) -> str:
    return f"fleet.{env}.veh.{vid}"


def state_subject(env: str, vid: str, channel: str) -> str:
    return f"fleet.{env}.veh.{vid}.state.{channel}"


def event_subject(env: str, vid: str, event_type: str) -> str:
    return f"fleet.{env}.veh.{vid}.evt.{event_type}"


def track_subject(env: str, vid: str) -> str:
    """The flight recorder's samples of one vehicle (TWIN_TRACKS; `vid="*"` for a filter)."""
    return f"fleet.{env}.veh.{vid}.track"


def cmd_subject(env: str, vid: str, name: str) -> str:
    return f"fleet.{env}.veh.{vid}.cmd.{name}"


def shadow_key(env: str, vid: str, doc: str) -> str:
    """KV key of a shadow document: desired, reported, config or meta."""
    return f"fleet.{env}.veh.{vid}.{doc}"


SHADOW_STREAM = f"KV_{SHADOW_BUCKET}"  # the stream behind the shadow bucket


def shadow_kv_subject(key: str) -> str:
    """The stream subject of a shadow KV key: what consumers filter on and gets by subject ask for."""
    return f"$KV.{SHADOW_BUCKET}.{key}"


def mav_down_subject(env: str, vid: str) -> str:
    """Core NATS (not stored): raw MAVLink frames from the vehicle, published by its gateway (the tunnel)."""
    return f"fleet.{env}.veh.{vid}.mav.down"


def mav_up_subject(env: str, vid: str) -> str:
    """Core NATS (not stored): raw MAVLink frames for the vehicle, from `mavjet tunnel` (operator permission)."""
    return f"fleet.{env}.veh.{vid}.mav.up"


def logs_prefix(env: str, vid: str) -> str:
    """Every TWIN_LOGS subject of one vehicle starts here (what its credential may write and read)."""
    return f"fleet.{env}.veh.{vid}.logs"


def log_chunk_subject(env: str, vid: str, sha256_hex: str) -> str:
    """The chunks of one log's bytes, hash-addressed: a log stored twice is sent once."""
    return f"{logs_prefix(env, vid)}.c.{sha256_hex}"


def log_record_subject(env: str, vid: str, name: str) -> str:
    """The name record of one log, `<log id>-<date>.bin` (each dot-separated part one token)."""
    for part in name.split("."):
        check_token("log name", part)
    return f"{logs_prefix(env, vid)}.n.{name}"


def log_records_filter(env: str, vid: str = "*") -> str:
    return f"{logs_prefix(env, vid)}.n.>"


def state_filter(env: str, vid: str = "*", channel: str = ">") -> str:
    return f"fleet.{env}.veh.{vid}.state.{channel}"


def event_filter(env: str, vid: str = "*", event_type: str = ">") -> str:
    return f"fleet.{env}.veh.{vid}.evt.{event_type}"


def command_consumer(vid: str) -> str:
    """The durable TWIN_CMD consumer of the gateway serving `vid` (its existence says a gateway registered it)."""
    return f"gw_{vid}"


def cmd_filter(env: str, vid: str = "*") -> str:
    return f"fleet.{env}.veh.{vid}.cmd.>"


def parse_subject(subject: str) -> tuple[str, str, str, str]:
    """Split `fleet.<env>.veh.<vid>.<kind>.<name>` into (env, vid, kind, name)."""
    parts = subject.split(".")
    if len(parts) < 6 or parts[0] != "fleet" or parts[2] != "veh":
        raise ValueError(f"not a fleet subject: {subject!r}")
    return parts[1], parts[3], parts[4], ".".join(parts[5:])


# Ownership (docs/ownership.md): one lease per vehicle in TWIN_LEASES, held by the gateway that may act.
LEASES_BUCKET = "TWIN_LEASES"
LEASES_STREAM = f"KV_{LEASES_BUCKET}"  # the stream behind the lease bucket


def lease_key(env: str, vid: str) -> str:
    """KV key of a vehicle's lease (beside its shadow keys, so a credential can be limited to its own)."""
    return f"fleet.{env}.veh.{vid}.lease"


_PLAIN_KEY = re.compile(r"[-_=A-Za-z0-9]{1,64}")


def inflight_key(env: str, vid: str, cmd_id: str) -> str:
    """KV key (TWIN_LEASES) of a command in flight and then its outcome, readable by the vehicle's next owner.

    A command id is any printable ASCII (contract/commands.py); one that is not a
    plain KV key token is written as `x` + its hex, so no two ids share a key.
    """
    token = cmd_id if _PLAIN_KEY.fullmatch(cmd_id) and not cmd_id.startswith("x") else "x" + cmd_id.encode().hex()
    return f"fleet.{env}.veh.{vid}.cmd.{token}"


def lease_kv_subject(key: str) -> str:
    """The stream subject of a lease key."""
    return f"$KV.{LEASES_BUCKET}.{key}"


def presence_key(env: str, vid: str, gateway_id: str) -> str:
    """KV key (TWIN_LEASES) of one gateway's presence record for a vehicle it stands by for (docs/ownership.md).

    `gateway_id` is one token unique per process (`GatewayIdentity.key_id`), so two
    standbys never share a key and a restarted one writes a new record.
    """
    return f"fleet.{env}.veh.{vid}.gw.{check_token('gateway id', gateway_id)}"


def presence_filter(env: str, vid: str = "*") -> str:
    """The stream subject of every presence record of `vid` (`*`: every vehicle), for readers' consumers."""
    return lease_kv_subject(f"fleet.{env}.veh.{vid}.gw.*")


# Fleet rollouts (docs/rollout.md): `mavjet rollout`'s state, so a killed operator process resumes it.
ROLLOUTS_BUCKET = "TWIN_ROLLOUTS"


def rollout_key(env: str, rollout_id: str) -> str:
    """KV key (TWIN_ROLLOUTS) of one rollout's document; `rollout_id="*"` lists them."""
    return f"fleet.{env}.rollout.{rollout_id}"


def rollout_previous_key(env: str, rollout_id: str, vid: str) -> str:
    """KV key (TWIN_ROLLOUTS) of the desired a rollout replaced on `vid`: what a rollback restores."""
    return f"fleet.{env}.rollout.{rollout_id}.prev.{vid}"


def tags_key(env: str, vid: str) -> str:
    """KV key (TWIN_ROLLOUTS) of a vehicle's operator-set tags, which rollout selectors match with its `meta`."""
    return f"fleet.{env}.veh.{vid}.tags"


def rollout_event_subject(env: str, rollout_id: str, event_type: str) -> str:
    """A rollout's fleet-level events (TWIN_EVENTS): start, each wave, halt, abort, done, rollback."""
    return f"fleet.{env}.rollout.{rollout_id}.evt.{event_type}"


def rollout_event_filter(env: str, rollout_id: str = "*") -> str:
    return f"fleet.{env}.rollout.{rollout_id}.evt.>"
