"""Message content as a byte range of a queue file (the agents' ``ContentSource``).

The content is stored raw (as received, after SMTP dot-unstuffing), so an
agent streams ``size`` bytes from ``offset`` and must do its own dot-stuffing.
Reads happen in a worker thread, one chunk per hop, so a 100 MB message never
blocks the event loop nor sits in memory whole. ``run`` (optional) is how the
first read (open + first chunk, all of a small message) gets to a thread: the
daemon passes its ``IoBatcher.submit`` so that read shares a hop with other
spool work instead of costing one of its own; without it, ``asyncio.to_thread``.
``data`` (optional) is the content itself, when the caller read it already (the
queue manager's load reads small files whole, ``qmgrd.spool.loadread``): then
neither ``chunks`` nor ``read`` touches the file.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from qmgrd.errors import SpoolError
from qmgrd.spool.records import QueueFile, QueueFileIOError, open_regular

Runner = Callable[[Callable[[], Any]], Awaitable[Any]]  # runs a blocking callable off the loop


@dataclass(frozen=True, slots=True)
class QueueFileContent:
    """The content of one queue file; implements ``qmgrd.delivery.agent.ContentSource``."""

    path: Path
    offset: int
    size: int
    run: Runner | None = field(default=None, compare=False)  # the first read's thread hop
    # The content itself when the caller holds it already (the load read it): no file read.
    data: bytes | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, qf: QueueFile) -> QueueFileContent:
        return cls(qf.path, qf.content_offset, qf.content_size)

    async def chunks(self, chunk_size: int = 65536) -> AsyncIterator[bytes]:
        """Yield the content in order; SpoolError if the file vanished or is short.

        The open and the first read share one thread hop (most mail fits in one
        chunk, so a delivery costs a single hop for its content).
        """
        if self.data is not None:
            for pos in range(0, len(self.data), chunk_size):
                yield self.data[pos : pos + chunk_size]
            return
        end = self.offset + self.size
        want = min(chunk_size, self.size)
        first = partial(_open_and_read, self.path, want, self.offset, want == self.size)
        try:
            if self.run is not None:
                fd, data = await self.run(first)
            else:
                fd, data = await asyncio.to_thread(first)
        except OSError as exc:
            raise QueueFileIOError(f"{self.path}: cannot read content: {exc.strerror}") from exc
        try:
            pos = self.offset
            while True:
                if pos < end and not data:
                    raise SpoolError(f"{self.path}: content ends early at offset {pos}")
                pos += len(data)
                if data:
                    yield data
                if pos >= end:
                    return
                data = await asyncio.to_thread(os.pread, fd, min(chunk_size, end - pos), pos)
        finally:
            if fd >= 0:
                os.close(fd)

    def read(self) -> bytes:
        """The whole content, synchronously (bounces, tests)."""
        if self.data is not None:
            return self.data
        try:
            with os.fdopen(open_regular(self.path, os.O_RDONLY), "rb") as f:
                f.seek(self.offset)
                data = f.read(self.size)
        except OSError as exc:
            raise QueueFileIOError(f"{self.path}: cannot read content: {exc.strerror}") from exc
        if len(data) != self.size:
            raise SpoolError(f"{self.path}: content ends early")
        return data


def _open_and_read(path: Path, want: int, offset: int, whole: bool) -> tuple[int, bytes]:
    """Open and read the first chunk; with ``whole`` (it is all the content) and a full
    read, the descriptor is closed here too (fd -1): no system call left for the loop."""
    fd = open_regular(path, os.O_RDONLY)
    try:
        data = os.pread(fd, want, offset) if want > 0 else b""
    except BaseException:
        os.close(fd)
        raise
    if whole and len(data) == want:
        os.close(fd)
        return -1, data
    return fd, data


def read_content(path: Path) -> bytes:
    """The content of a queue file, whole and synchronously (for bounce messages)."""
    return QueueFileContent.of(QueueFile.open(path)).read()
