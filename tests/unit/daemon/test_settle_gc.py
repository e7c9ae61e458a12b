"""settle_gc: after start-up, start-up's objects are frozen and young collections are rarer."""

from __future__ import annotations

import gc
import subprocess
import sys

from qmgrd.daemon.process import GC_THRESHOLDS, settle_gc


def test_settle_gc_freezes_start_up_and_raises_the_thresholds() -> None:
    """Objects alive at the call are frozen (out of every collection); thresholds are ours."""
    before = gc.get_threshold()
    try:
        settle_gc()
        assert gc.get_threshold() == GC_THRESHOLDS
        assert gc.get_threshold()[0] > before[0]
        assert gc.get_freeze_count() > 0
        assert gc.get_count()[2] == 0  # everything older went to the permanent generation
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_cyclic_garbage_is_still_collected_after_settle_gc() -> None:
    """In a fresh interpreter: a reference cycle made after settle_gc is freed by the
    collector on its own (no explicit gc.collect), once enough allocations happened."""
    code = (
        "import gc, weakref\n"
        "from qmgrd.daemon.process import settle_gc\n"
        "settle_gc()\n"
        "class Node: pass\n"
        "a, b = Node(), Node()\n"
        "a.peer, b.peer = b, a\n"
        "gone = weakref.ref(a)\n"
        "del a, b\n"
        "keep = [[] for _ in range(100_000)]\n"
        "print('freed' if gone() is None else 'alive')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "freed"
