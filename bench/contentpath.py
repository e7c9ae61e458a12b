"""CPU per message of the queue manager's content path, without SMTP: load read and DATA encoding.

    .venv/bin/python bench/contentpath.py                        # 1 KB and 100 KB shapes
    /work/main/.venv/bin/python bench/contentpath.py --repo /work/main

For each content shape (``text``: lines of 78 letters as smtp-source sends;
``base64``: 76-character lines of an attachment; ``bare-lf``: text with LF line
ends, the slow path) at each size, prints microseconds per message
(``time.process_time``, best of ``--repeat`` runs of ``--number`` calls) for:

- ``feed``: ``DataEncoder.feed`` of the whole content (what every delivery
  pays), and of that ``crlf``: the CRLF-only check (``_crlf_only``) and
  ``dots``: the line-start dot walk;
- ``load-whole`` / ``load-kept``: ``load_queue_file`` of the queue file with
  the content not kept (the budget is spent: ``keep=0``) and kept.

The CRLF-only check is what a "content is clean" record written at intake
would save a delivery; finding it at intake costs the same pass over the same
bytes (this bench's ``crlf`` column is that cost too). Numbers move with the
machine's load: say it (printed). Never asserts anything.
"""

from __future__ import annotations

import argparse
import base64
import os
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from functools import partial
from pathlib import Path

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--sizes", default="1,100", help="comma list of content sizes in KB")
parser.add_argument("--shapes", default="text,base64,bare-lf", help="comma list of shapes")
parser.add_argument("--number", type=int, default=200, help="calls per timing")
parser.add_argument("--repeat", type=int, default=7, help="timings (the best is printed)")
parser.add_argument("--repo", default=str(Path(__file__).resolve().parent.parent))
ARGS = parser.parse_args()
sys.path.insert(0, ARGS.repo)

from qmgrd.delivery.content import (  # noqa: E402
    DataEncoder,
    _crlf_only,
    _may_start_a_line_with_a_dot,
)
from qmgrd.spool.loadread import load_queue_file  # noqa: E402
from qmgrd.spool.records import Envelope, RecipientSpec, encode_queue_file  # noqa: E402


def content(shape: str, size: int) -> bytes:
    """About ``size`` bytes of content of ``shape`` (a short header section first)."""
    head = b"From: a@example.org\r\nSubject: bench\r\n\r\n"
    if shape == "base64":
        raw = base64.encodebytes(os.urandom(size * 3 // 4)).replace(b"\n", b"\r\n")
        return head + raw[: max(size - len(head), 0)]
    line = bytes(ord("a") + i % 26 for i in range(78)) + b"\r\n"
    body = line * (max(size - len(head), 0) // len(line) + 1)
    data = head + body[: max(size - len(head), 0)]
    return data.replace(b"\r\n", b"\n") if shape == "bare-lf" else data


def best_us(fn: Callable[..., object], *args: object) -> float:
    """Best process-CPU microseconds per call of ``fn(*args)``."""
    timer = timeit.Timer(partial(fn, *args), timer=time.process_time)
    number: int = ARGS.number
    best: float = min(timer.repeat(repeat=ARGS.repeat, number=number))
    return best / number * 1e6


def feed(data: bytes) -> bytes:
    """One delivery's encoding of ``data``."""
    return DataEncoder().feed(data)


def main() -> None:
    """Print one line per shape and size."""
    print(f"cpus={os.cpu_count()} loadavg={os.getloadavg()[0]:.1f} repo={ARGS.repo}")
    envelope = Envelope("a@example.org", (RecipientSpec("b@example.net"),), 1.0)
    with tempfile.TemporaryDirectory() as tmp:
        for shape in ARGS.shapes.split(","):
            for kb in (int(s) for s in ARGS.sizes.split(",")):
                data = content(shape, kb * 1024)
                path = Path(tmp) / f"Q{shape}{kb}".replace("-", "")
                head, tail = encode_queue_file(envelope, len(data))
                path.write_bytes(head + data + tail)
                encoded = best_us(feed, data)
                crlf = best_us(_crlf_only, data)
                dots = best_us(_may_start_a_line_with_a_dot, data)
                whole = best_us(load_queue_file, path, 100, 0)
                kept = best_us(load_queue_file, path, 100, len(data))
                print(
                    f"{shape:8s} {kb:4d}k  us/msg: feed={encoded:7.1f} (crlf={crlf:6.1f} "
                    f"dots={dots:5.1f})  load-whole={whole:6.1f} load-kept={kept:6.1f}"
                )


if __name__ == "__main__":
    main()
