"""bench/contentpath.py runs and prints one line per shape and size (no timing asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "bench" / "contentpath.py"


def test_prints_one_line_per_shape_and_size() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--sizes", "1,2", "--number", "1", "--repeat", "1"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.splitlines()
    assert out[0].startswith("cpus=")
    rows = [line.split()[:2] for line in out[1:]]
    shapes = ("text", "base64", "bare-lf")
    assert rows == [[shape, size] for shape in shapes for size in ("1k", "2k")]
    for line in out[1:]:
        for column in ("feed=", "crlf=", "dots=", "load-whole=", "load-kept="):
            assert column in line
