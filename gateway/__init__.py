"""The mavjet daemon: MAVLink vehicles to JetStream digital twins.

`daemon` supervises the fleet, `entry` is the process entry, `config` its
settings, `services` the seams a service (commands, shadow, routes) sees.
The folders answer one question each:

- `twin/`     what is this vehicle's state (telemetry model, the twin, its samples, events' rules)
- `publish/`  how does it reach JetStream (the connection, state and event publishing, spool, uplink)
- `stores/`   where do artifacts go (TWIN_BLOBS, TWIN_LOGS, TWIN_TRACKS)
- `runtime/`  how does the process run (workers, layout, systemd, logs, metrics)
- `commands/` and `shadow/` the two services that act on a vehicle
- `ownership/` which gateway may act for a vehicle (a lease per vehicle, docs/ownership.md)
"""
