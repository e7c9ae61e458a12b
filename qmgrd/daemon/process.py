"""What every daemon process sets up (``qmgrd run`` and its listener workers): logs, event loop.

``open_log_output(cfg)`` checks ``log_format`` (ConfigError for an unknown
one) and calls ``qmgrd.log.configure_logging`` with ``maillog_file``, the
short host name and ``syslog_name``; it returns the ``LogOutput`` the caller
closes at exit. Every process of the daemon (the queue manager and each
listener worker) opens its own, so its lines carry its own pid.

``die_with_parent(parent, name)`` (every worker process, first thing): the
process gets SIGKILL when its parent dies (``PR_SET_PDEATHSIG``, Linux) and
exits at once if the parent is already gone; it is named ``name``
(``PR_SET_NAME``: ``ps -o comm``, top, the bench's per-process CPU figures).

``worker_main(parent, config_dir, name=, program=, body=)`` is a worker
process's life (``qmgrd.daemon.smtpd``, ``qmgrd.daemon.delivery``):
``die_with_parent``, SIGINT and SIGHUP ignored (the queue manager forwards
what concerns the workers), the configuration loaded and the log output
opened (an error: ``qmgrd/PROGRAM: fatal: ...`` on stderr, status 1), then
``body(cfg)`` run on a new loop (a ``QmgrdError`` from it is logged, status
1); 0 after a clean end. ``worker_signals(stop)``, on the worker's loop: SIGTERM
sets ``stop``, SIGINT and SIGHUP do nothing.

``loop_factory()`` is uvloop's loop when uvloop is installed (None: plain
asyncio), for ``asyncio.Runner``.

``settle_gc()`` (every daemon process, once its start-up is done: the queue
manager when the daemon has started, a worker before its loop runs) moves what
start-up allocated (modules, configuration, tables) out of the cyclic garbage
collector's way (``gc.freeze``) and collects the young generations less often
(``GC_THRESHOLDS``): each message allocates a few dozen container objects, and
with CPython's default threshold of 700 the collector ran every few messages,
walking every object still alive in the young generations each time (about 5 %
of the queue manager's CPU at 1 KB messages). Garbage in reference cycles is
still collected, a little later.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from qmgrd.config import Config, load_config
from qmgrd.errors import ConfigError, QmgrdError
from qmgrd.log import LogOutput, configure_logging, get_logger

__all__ = [
    "die_with_parent",
    "loop_factory",
    "open_log_output",
    "settle_gc",
    "worker_main",
    "worker_signals",
]

GC_THRESHOLDS = (10_000, 50, 100)  # gc.set_threshold after start-up (CPython's: 700, 10, 10)

_PR_SET_NAME = 15
_PR_SET_PDEATHSIG = 1


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


def die_with_parent(parent: int, name: str) -> None:
    """SIGKILL this process when its parent dies (Linux); exit now if it is already gone.

    It also names the process ``name``; its command line stays the python one.
    """
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        libc.prctl(_PR_SET_NAME, name.encode(), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop factory, or None (plain asyncio) without uvloop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def worker_main(
    parent: int,
    config_dir: Path,
    *,
    name: str,
    program: str,
    body: Callable[[Config], Coroutine[Any, Any, None]],
) -> int:
    """A worker process from start to exit status (module doc)."""
    die_with_parent(parent, name)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # until the loop's handlers take over
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        cfg = load_config(config_dir)
        output = open_log_output(cfg)
    except QmgrdError as exc:
        print(f"qmgrd/{program}: fatal: {exc}", file=sys.stderr)
        return 1
    settle_gc()
    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            runner.run(body(cfg))
    except QmgrdError as exc:
        get_logger(program).error(f"fatal: {exc}")
        return 1
    finally:
        output.close()
    return 0


def settle_gc() -> None:
    """Start-up is over: freeze its objects, collect young generations less often (module doc)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def worker_signals(stop: asyncio.Event) -> None:
    """On the running loop: SIGTERM sets ``stop``; SIGINT and SIGHUP are ignored."""
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    for signum in (signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(signum, lambda: None)
