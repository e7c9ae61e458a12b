"""bench/syncmicro.py still runs: a line per variant and round, its files removed (no timing)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_prints_both_variants_and_leaves_nothing(tmp_path: Path) -> None:
    bench = str(REPO / "bench" / "syncmicro.py")
    proc = subprocess.run(
        [sys.executable, bench, "-n", "5", "--rounds", "2", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    heads = [line.split()[:2] for line in proc.stdout.splitlines()]
    assert heads == [
        ["round=1", "fsync"],
        ["round=1", "fdatasync"],
        ["round=1", "syncfs/8"],
        ["round=2", "fsync"],
        ["round=2", "fdatasync"],
        ["round=2", "syncfs/8"],
    ]
    assert all("us/call" in line for line in proc.stdout.splitlines())
    assert list(tmp_path.iterdir()) == []
