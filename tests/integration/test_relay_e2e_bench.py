"""The throughput benchmark still runs end to end (a small smoke run, no timing asserted)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_throughput_bench_relays_every_message_and_prints_its_numbers() -> None:
    """bench/throughput.py with 40 two-recipient messages: the sink counts all, one result line."""
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "throughput.py"),
            "-n",
            "40",
            "-c",
            "4",
            "--rcpts",
            "2",
            "--loop",
            "asyncio",
            "--no-fsync",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("loop=")]
    assert len(lines) == 1, proc.stdout
    assert re.search(r"messages=40 recipients=80 rate=\s*\d+ msg/s", lines[0]), lines[0]
    assert "problems=0" in lines[0]
    assert re.search(r"daemon_cpu=\s*[\d.]+ ms/msg", lines[0])
