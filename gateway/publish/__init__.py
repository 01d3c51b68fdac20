"""How state and events reach JetStream: one connection, the state path, the event spool, a thin uplink."""
