"""fsync, fdatasync or a batch's syncfs for a queue file: CPU and wall time per file.

    .venv/bin/python bench/syncmicro.py                    # 1500 calls per variant, 3 rounds
    .venv/bin/python bench/syncmicro.py -n 3000 --same-size --dir /var/tmp

Each call rewrites a pooled file the way ``QueueFileWriter.finish`` does (open,
write from offset 0, cut to length) and then makes it durable with ``fsync``
or ``fdatasync``; 64 files are used in turn (a recycle pool). The lengths vary
around 1 KB (the standard 1 KB message), so the size changes at almost every
call, as it does in the relay; with ``--same-size`` every rewrite keeps the
file's length (only the data and the timestamps change). Prints this
process's CPU (user + system, ``getrusage``) and wall time per call for each
variant, alternated; never asserts anything. The third variant is the group
commit's other way (``qmgrd.spool.batchsync``): ``--batch`` files rewritten,
then one ``syncfs`` of their file system for all of them (default 8; the
relay's batches under the standard benchmark hold 3-4).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import shutil
import tempfile
import time
from collections.abc import Callable

FILES = 64


def _round(
    directory: str, sync: Callable[[int], None], calls: int, same_size: bool, batch: int = 1
) -> str:
    paths = [f"{directory}/f{i}" for i in range(FILES)]
    for path in paths:
        with open(path, "wb") as f:
            f.write(os.urandom(1300))
            f.flush()
            os.fsync(f.fileno())
    data = os.urandom(1100)
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    for i in range(calls):
        length = 1000 if same_size else 1000 + (i * 37) % 100
        fd = os.open(paths[i % FILES], os.O_RDWR)
        try:
            os.pwrite(fd, data[:length], 0)
            os.ftruncate(fd, length)
            if (i + 1) % batch == 0 or i + 1 == calls:
                sync(fd)  # batch 1: every file; else one syncfs for the batch's files
        finally:
            os.close(fd)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    user = after.ru_utime - before.ru_utime
    system = after.ru_stime - before.ru_stime
    return (
        f"cpu {(user + system) / calls * 1e6:6.1f} us/call (system {system / calls * 1e6:5.1f})"
        f"  wall {wall / calls * 1e6:5.0f} us/call  loadavg {os.getloadavg()[0]:.1f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-n", type=int, default=1500, help="calls per variant and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--same-size", action="store_true", help="every rewrite keeps the length")
    parser.add_argument("--dir", default=None, help="where the files live (default: TMPDIR)")
    parser.add_argument("--batch", type=int, default=8, help="files per syncfs (the third way)")
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="syncmicro-", dir=args.dir)
    syncfs = ctypes.CDLL(None, use_errno=True).syncfs
    variants: list[tuple[str, Callable[[int], None], int]] = [
        ("fsync", os.fsync, 1),
        ("fdatasync", os.fdatasync, 1),
        (f"syncfs/{args.batch}", syncfs, max(1, args.batch)),
    ]
    try:
        for r in range(1, args.rounds + 1):
            for name, sync, batch in variants:
                line = _round(directory, sync, args.n, args.same_size, batch)
                print(f"round={r} {name:<9} {line}", flush=True)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
