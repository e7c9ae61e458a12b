"""What every daemon process sets up (``qmgrd run`` and its listener workers): logs, event loop.

``open_log_output(cfg)`` checks ``log_format`` (ConfigError for an unknown
one) and calls ``qmgrd.log.configure_logging`` with ``maillog_file``, the
short host name and ``syslog_name``; it returns the ``LogOutput`` the caller
closes at exit. Every process of the daemon (the queue manager and each
listener worker) opens its own, so its lines carry its own pid.

``loop_factory()`` is uvloop's loop when uvloop is installed (None: plain
asyncio), for ``asyncio.Runner``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from qmgrd.config import Config
from qmgrd.errors import ConfigError
from qmgrd.log import LogOutput, configure_logging

__all__ = ["loop_factory", "open_log_output"]


def open_log_output(cfg: Config) -> LogOutput:
    """Configure this process's logging from ``cfg`` (module doc)."""
    log_format: Any = cfg.get_str("log_format")
    if log_format not in ("postfix", "json"):
        raise ConfigError(f"log_format: unknown format {log_format!r}")
    return configure_logging(
        log_format,
        maillog_file=cfg.get_optional_path("maillog_file"),
        hostname=cfg.get_str("myhostname").split(".")[0],
        program=cfg.get_str("syslog_name"),
    )


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop factory, or None (plain asyncio) without uvloop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory
