"""Record where queue files are linked and renamed to (HOLD must never pass through incoming/).

``record_placements(monkeypatch)`` wraps ``os.link``, ``os.rename`` and
``qmgrd.spool.diskio.link`` (the queue-file writer's link) for the
rest of the test and returns the list it fills with each call's destination
path. The calls still happen; threads (the spool's workers) are seen too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from qmgrd.spool import diskio


def record_placements(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Destinations of every link and rename from now on (module doc)."""
    seen: list[Path] = []
    real_link, real_rename, real_gil_link = os.link, os.rename, diskio.link

    def link(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        seen.append(Path(dst))
        real_link(src, dst, *args, **kwargs)

    def rename(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        seen.append(Path(dst))
        real_rename(src, dst, *args, **kwargs)

    def gil_link(src: str, dst: str) -> None:
        seen.append(Path(dst))
        real_gil_link(src, dst)

    monkeypatch.setattr(os, "link", link)
    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(diskio, "link", gil_link)
    return seen
