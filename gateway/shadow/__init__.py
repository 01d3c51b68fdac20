"""The shadow: operators write what a vehicle should be, the gateway reports what it is.

TWIN_SHADOW keys per vehicle (DESIGN.md, Shadow; docs/shadow.md):
`desired` (operators), `reported` (this gateway only, optimistic concurrency),
`config` and `meta` (written on connect).

- `document` — the desired document: schema, per-field validation reasons. Pure.
- `diff` — desired vs live, the per-field delta, the backoff schedule. Pure.
- `fence` — geofence and stream-rate specs to MAVLink items, params, message ids. Pure.
- `kvstore` — the KV side: a desired watcher that survives reconnects, and
  the reported writer with revision retry.
- `reconciler` — one vehicle's controller acting through drivers.mavlink.runner.
- `service` — the gateway extension running one reconciler per vehicle.
"""

from __future__ import annotations
