"""Record where queue files are linked and renamed to (HOLD must never pass through incoming/).

``record_placements(monkeypatch)`` wraps ``os.link`` and ``os.rename`` for the
rest of the test and returns the list it fills with each call's destination
path. The calls still happen; threads (the spool's workers) are seen too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest


def record_placements(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Destinations of every ``os.link``/``os.rename`` from now on (module doc)."""
    seen: list[Path] = []
    real_link, real_rename = os.link, os.rename

    def link(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        seen.append(Path(dst))
        real_link(src, dst, *args, **kwargs)

    def rename(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        seen.append(Path(dst))
        real_rename(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "link", link)
    monkeypatch.setattr(os, "rename", rename)
    return seen
