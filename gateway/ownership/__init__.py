"""Ownership: one gateway acts for a vehicle, the others stand by (docs/ownership.md).

A lease per vehicle in the replicated KV bucket TWIN_LEASES; its revision is
the fencing token.

- `lease` — one vehicle's lease as a sans-IO machine: which KV operation to
  do next, what an answer means, and whether this gateway may act at a given
  monotonic time (acquire, take over a stale lease, renew, fence, release).
  Pure.
- `store` — the bucket over JetStream: get, compare-and-set write and delete,
  each bounded in time (`LeaseStore`, the KV seam).
- `keeper` — one task per gateway running every vehicle's machine against
  the store (`Ownership`, the seam the daemon uses: `may_act(vid)`, the
  token, waiting for changes; `OwnershipListener` hears every change).
- `presence` — a standby's presence record per vehicle, so readers see the
  standbys as well as the owner the lease names.
- `service` — all of it in the daemon (`DaemonOwnership`): gates, events,
  log lines, metrics, the release watch, presence.

What remains of issue 47 is listed in docs/ownership.md.
"""

from __future__ import annotations
