"""How the process runs: workers, the state dir's layout, systemd notify, logging, metrics."""
