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

Not wired into the daemon yet: what remains is listed in docs/ownership.md.
"""

from __future__ import annotations
