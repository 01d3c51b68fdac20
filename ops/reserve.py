"""How much file storage provisioning reserves, and whether the server has it.

A stream's `max_bytes` is a reservation against the server's JetStream
`max_file_store` (a stock `nats-server -js` allows 75% of the free disk). The
definitions in deploy/jetstream/ reserve what a production hub needs (the
`large` preset: 100 GB of events, 10 GB of state); `--size small|medium`
scales them to a laptop or a companion computer.

The server's remaining headroom is not visible to a client (account info
reports the account's limits, unlimited on a stock server, not the server's),
so `headroom_bytes` measures it: it creates a throwaway stream reserving N
bytes, deletes it at once, and binary-searches N. `reservable` is one such
probe. Nothing else is created or changed, which is why a dry run may use it.
"""

from __future__ import annotations

import secrets

import anyio
from nats.js import JetStreamContext
from nats.js import api as jsapi
from nats.js.errors import APIError

GiB = 1024**3

# Per stream: max_bytes for each preset (the object store, TWIN_LOGS and TWIN_TRACKS are unbounded unless a preset bounds them).
SIZES: dict[str, dict[str, int]] = {
    "small": {"TWIN_EVENTS": 1 * GiB, "TWIN_STATE": 256 * 1024**2, "OBJ_TWIN_BLOBS": 1 * GiB,
              "TWIN_LOGS": 512 * 1024**2, "TWIN_TRACKS": 256 * 1024**2},
    "medium": {"TWIN_EVENTS": 10 * GiB, "TWIN_STATE": 2 * GiB, "OBJ_TWIN_BLOBS": 10 * GiB,
               "TWIN_LOGS": 5 * GiB, "TWIN_TRACKS": 5 * GiB},
    "large": {},  # the definitions as written
}


def human_bytes(n: int) -> str:
    for unit, size in (("TiB", 1024**4), ("GiB", GiB), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _insufficient(exc: APIError) -> bool:
    # 10047: insufficient storage resources available; the text is the fallback for older servers.
    return getattr(exc, "err_code", None) == 10047 or "insufficient" in str(exc).lower()


STORE_RACE_ERR_CODE = 10049  # "error creating store for stream"
STORE_RACE_ATTEMPTS = 4


async def add_stream_retrying(js: JetStreamContext, config: jsapi.StreamConfig) -> None:
    """add_stream, tried again on the server's transient "error creating store for stream".

    Seen on a fresh server right after `reservable`'s probe stream was deleted: the
    server's cleanup of the account's now-empty stream directory raced the next
    create ("mkdir .../$G/streams: no such file or directory"). A moment later the
    same create succeeds; any other error is raised at once.
    """
    for attempt in range(1, STORE_RACE_ATTEMPTS + 1):
        try:
            await js.add_stream(config)
            return
        except APIError as exc:
            if exc.err_code != STORE_RACE_ERR_CODE or attempt == STORE_RACE_ATTEMPTS:
                raise
            await anyio.sleep(0.25 * attempt)


async def reservable(js: JetStreamContext, n_bytes: int) -> bool:
    """Can the server reserve `n_bytes` more of file storage? (a throwaway stream, deleted at once)"""
    if n_bytes <= 0:
        return True
    name = f"MAVJET_PROBE_{secrets.token_hex(4).upper()}"
    cfg = jsapi.StreamConfig(name=name, subjects=[f"_mavjet.probe.{name}"], storage=jsapi.StorageType.FILE,
                             max_bytes=n_bytes, num_replicas=1)
    try:
        await add_stream_retrying(js, cfg)
    except APIError as exc:
        if _insufficient(exc):
            return False
        raise
    await js.delete_stream(name)
    return True


async def headroom_bytes(js: JetStreamContext, upper: int, *, steps: int = 14) -> int:
    """The largest reservation up to `upper` the server accepts now (within upper / 2**steps)."""
    lo, hi = 0, upper
    for _ in range(steps):
        if hi - lo <= max(1, upper >> steps):
            break
        mid = (lo + hi) // 2
        if await reservable(js, mid):
            lo = mid
        else:
            hi = mid
    return lo
