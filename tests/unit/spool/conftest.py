"""The spool tests' shared fixture: an empty spool with its directories."""

from __future__ import annotations

from pathlib import Path

import pytest

from qmgrd.spool import Spool


@pytest.fixture
def spool(tmp_path: Path) -> Spool:
    s = Spool(tmp_path / "spool")
    s.ensure_dirs()
    return s
