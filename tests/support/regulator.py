"""A listener worker's intake regulator on a token pipe of its own, for listener tests."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from qmgrd.daemon.intakeflow import FlowSettings, WorkerRegulator


@contextlib.contextmanager
def worker_regulator(settings: FlowSettings) -> Iterator[WorkerRegulator]:
    """A ``WorkerRegulator`` reading an empty pipe (no tokens unless the test writes some);
    stopped and the pipe closed after the block."""
    r, w = os.pipe()
    regulator = WorkerRegulator(r, settings)
    try:
        yield regulator
    finally:
        regulator.stop()
        os.close(r)
        os.close(w)
