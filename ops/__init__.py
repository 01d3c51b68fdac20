"""The operator CLI: `mavjet <command>` (the top layer). `python -m mavjet.ops` runs the dispatcher."""
