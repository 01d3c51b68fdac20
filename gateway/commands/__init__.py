"""Commands through TWIN_CMD: the gateway side of DESIGN.md (Commands).

- `catalogue` — pure: command names, parameter validation, the command body
  format, preconditions against the live model, and the mapping to MAV_CMDs.
- `ledger` — the executed-id ledger (SQLite under the state dir) that makes
  execution effectively once across redeliveries and gateway restarts.
- `executor` — one command message from fetch to ack/nak/term and its single
  `cmd_result` event.
- `consumer` — the gateway extension: one durable pull consumer per vehicle,
  one command at a time per vehicle, re-created when NATS restarts.
- `client` — publishing commands and waiting for their results (CLI, demo,
  benchmark, tests); `sortie` flies a demo sortie through TWIN_CMD.
"""

from __future__ import annotations
