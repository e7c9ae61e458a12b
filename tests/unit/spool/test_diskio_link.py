"""diskio.link: os.link's behaviour and errors, without handing the interpreter lock over."""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

import pytest

from qmgrd.spool import diskio


def test_links_a_file_under_a_second_name(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x")
    diskio.link(str(tmp_path / "a"), str(tmp_path / "b"))
    assert (tmp_path / "b").read_bytes() == b"x"
    assert os.stat(tmp_path / "a").st_nlink == 2


def test_raises_what_os_link_raises(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x")
    (tmp_path / "b").write_bytes(b"y")
    with pytest.raises(FileExistsError) as exists:
        diskio.link(str(tmp_path / "a"), str(tmp_path / "b"))
    assert exists.value.filename == str(tmp_path / "a")
    assert exists.value.filename2 == str(tmp_path / "b")
    with pytest.raises(FileNotFoundError):
        diskio.link(str(tmp_path / "missing"), str(tmp_path / "c"))
    assert (tmp_path / "b").read_bytes() == b"y"


def test_the_call_keeps_the_interpreter_lock() -> None:
    """libc's link through ctypes.PyDLL (a CDLL call would release the GIL)."""
    assert diskio._GIL_LINK is not None  # Linux with glibc: the test machine has it
    assert diskio._GIL_LINK._flags_ & ctypes._FUNCFLAG_PYTHONAPI  # type: ignore[attr-defined]


def test_without_libc_link_it_is_os_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = os.link

    def link(src: str, dst: str) -> None:
        calls.append(threading.current_thread().name)
        real(src, dst)

    monkeypatch.setattr(diskio, "_GIL_LINK", None)
    monkeypatch.setattr(os, "link", link)
    (tmp_path / "a").write_bytes(b"x")
    diskio.link(str(tmp_path / "a"), str(tmp_path / "b"))
    assert len(calls) == 1 and (tmp_path / "b").exists()
