"""The shadow: operators write what a vehicle should be, the gateway reports what it is.

TWIN_SHADOW keys per vehicle (docs/shadow.md): `desired` (operators),
`reported` (this gateway only, optimistic concurrency), `config` and `meta`
(written on connect).

- `document` — the desired document: schema, per-field validation reasons. Pure.
- `diff` — the per-field delta, the read-back cache, the flight-state rules. Pure.
- `fence` — reported geofence and stream-rate specs in MAVLink terms. Pure.
- `book` — the one retry book: attempts, backoff, the delta every step writes.
- `steps` — one step per field (params, mission, geofence, rates, mode,
  armed): a pure `observe()` and an `apply()` through the vehicle's session.
- `identity` — the `config` and `meta` documents.
- `kvstore` — the KV side: a desired watcher that survives reconnects, and
  the reported writer with revision retry.
- `watch` — one watch over many vehicles' `desired` keys (a gateway of
  several vehicles), or the per-key watch (a gateway of one).
- `reconciler` — one vehicle's loop: events, passes, reporting.
- `service` — the gateway service running one reconciler per vehicle.
"""

from __future__ import annotations
