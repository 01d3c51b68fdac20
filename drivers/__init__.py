"""Talking to autopilots. Nothing in this package knows about NATS."""
