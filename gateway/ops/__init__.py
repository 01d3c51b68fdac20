"""Operator subcommands that talk to a running twin over NATS."""
