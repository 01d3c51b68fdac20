"""Commands through TWIN_CMD: the gateway side (docs/commands.md).

The wire format (names, parameters, body codec, result kinds) is in
`mavjet.contract.commands`, so clients need not import the daemon. Here:

- `spec` — every command defined once: its wire spec, preconditions
  (`preconditions`, pure) and action (`actions`: the MAV_CMD or protocol it
  runs and how each ending becomes an outcome).
- `ledger` — commands by `(vid, cmd_id)`, in flight then final (SQLite under
  the state dir): execution effectively once across redeliveries and
  gateway restarts.
- `recovery` — what each command does when it was in flight at a crash
  (confirm from the vehicle's state, send again, or end `unknown`).
- `executor` — one command delivery from fetch to ack/term/retry/hand-back and
  its single `cmd_result` event; `delivery` — the delivery as it sees it.
- `lane` — one vehicle's commands in the gateway's hands: one at a time, in
  order, retries held, a bounded queue.
- `intake` — the TWIN_CMD consumers feeding the lanes: one per gateway (per
  500 vehicles), filtered to the vehicles it owns, or `gw_<vid>` per vehicle;
  `pull` — their pull requests.
- `consumer` — the gateway service wiring ledger, lanes and intakes.

Publishing commands and waiting for results is `mavjet.ops.client`.
"""

from __future__ import annotations
