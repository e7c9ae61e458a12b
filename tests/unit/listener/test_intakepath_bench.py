"""bench/intakepath.py still runs: scripted sessions are queued (no timing asserted).

Run as a subprocess: the bench configures the process's logging as a worker does.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.intakepath import script

REPO = Path(__file__).resolve().parents[3]


def test_script_ends_with_the_end_marker_after_a_line_end() -> None:
    for size in (0, 1, 1024, 102400, 70001):
        pieces = script(size)
        message = b"".join(pieces[4:-1])
        assert message.endswith(b"\r\n.\r\n") and pieces[-1] == b"QUIT\r\n"
        xlines = b"".join(script(size, "xlines")[4:-1])
        assert xlines.endswith(b"\r\n.\r\n") and len(xlines) - len(message) in (-2, 0, 2)
        assert xlines.count(b".") == message[: message.index(b"\r\n\r\n")].count(b".") + 1


def test_every_scripted_message_is_queued(tmp_path: Path) -> None:
    bench = str(REPO / "bench" / "intakepath.py")
    proc = subprocess.run(
        [sys.executable, bench, "--sizes", "1,100", "-m", "3", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split()[:2] for line in lines] == [["size=", "1KB"], ["size=", "100KB"]]
    assert all("queued=     3" in line for line in lines)
    assert list(tmp_path.iterdir()) == []  # the spool and maillog are removed
