"""Fixtures shared by every test directory (helpers live in ``tests.support``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from qmgrd.spool import Spool


@pytest.fixture
def spool(tmp_path: Path) -> Spool:
    """An empty spool at ``tmp_path/spool`` with its directories, without fsync."""
    s = Spool(tmp_path / "spool", fsync=False)
    s.ensure_dirs()
    return s
