"""``watch_logs``: captured structlog events that a test can also wait on.

It is ``structlog.testing.capture_logs`` (every event becomes a dict in a list,
with ``log_level``, and nothing is rendered) whose list is a ``LogWatch``:
``await logs.wait_for(predicate, what)`` wakes on each new event instead of
polling. Events logged from worker threads wake the waiter through the loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any, NoReturn

import structlog
from structlog.testing import LogCapture

from tests.support.waits import TIMEOUT, Changes

Event = MutableMapping[str, Any]


class LogWatch(list[Event]):
    """The captured events, oldest first, with an event-driven ``wait_for``."""

    def __init__(self) -> None:
        super().__init__()
        self.changes = Changes()

    def events(self, name_prefix: str) -> list[Event]:
        """Events whose ``event`` text starts with ``name_prefix``."""
        return [e for e in self if str(e.get("event", "")).startswith(name_prefix)]

    async def wait_for(
        self, predicate: Callable[[], bool], what: str, timeout: float = TIMEOUT
    ) -> None:
        """Return once ``predicate()`` holds, re-checked at each new event (bounded)."""
        await self.changes.wait_for(predicate, what, timeout)

    async def wait_event(self, name_prefix: str, count: int = 1, timeout: float = TIMEOUT) -> None:
        """Return once ``count`` events starting with ``name_prefix`` were logged."""
        await self.wait_for(
            lambda: len(self.events(name_prefix)) >= count,
            f"{count} {name_prefix!r} log event(s)",
            timeout,
        )


class _Capture(LogCapture):
    def __init__(self, watch: LogWatch) -> None:
        super().__init__()
        self.entries = watch
        self.watch = watch

    def __call__(self, logger: Any, method_name: str, event_dict: Event) -> NoReturn:
        try:
            super().__call__(logger, method_name, event_dict)
        finally:
            self.watch.changes.notify()


@contextmanager
def watch_logs() -> Iterator[LogWatch]:
    """Capture every log event while the block runs (see the module docstring)."""
    watch = LogWatch()
    capture = _Capture(watch)
    # As capture_logs does: change the configured list in place, since bound
    # loggers hold a reference to it.
    processors = structlog.get_config()["processors"]
    saved = list(processors)
    try:
        processors.clear()
        processors.append(capture)
        structlog.configure(processors=processors)
        yield watch
    finally:
        processors.clear()
        processors.extend(saved)
        structlog.configure(processors=processors)


@contextmanager
def saved_structlog() -> Iterator[None]:
    """Put structlog's configuration back afterwards (closing a ``LogOutput`` left in it)."""
    from qmgrd.log import LogOutput

    saved = structlog.get_config()
    try:
        yield
    finally:
        output = structlog.get_config().get("logger_factory")
        if isinstance(output, LogOutput):
            output.close()
        structlog.configure(**saved)
