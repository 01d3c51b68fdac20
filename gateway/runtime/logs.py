"""structlog setup: human-readable on a TTY, one JSON object per line otherwise.

Every event passes `mavjet.contract.redact.redact_event` last before rendering,
so a NATS password, token, JWT or nkey seed never reaches a log line whichever
field or exception message carries it.
"""

from __future__ import annotations

import logging
import sys

import structlog

from mavjet.contract.redact import redact_event


def configure(level: str = "info", *, json: bool | None = None) -> None:
    if json is None:
        json = not sys.stderr.isatty()
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            redact_event,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
