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
- `executor` — one command message from fetch to ack/nak/term and its single
  `cmd_result` event.
- `consumer` — the gateway service: one durable pull consumer per vehicle,
  one command at a time per vehicle, re-created when NATS restarts.

Publishing commands and waiting for results is `mavjet.ops.client`.
"""

from __future__ import annotations
