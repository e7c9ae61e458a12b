"""``qmgrd mailq`` and ``qmgrd qshape`` never put a sender's raw control bytes on the terminal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from qmgrd.spool import Envelope, ReasonRecord, RecipientSpec, Spool
from tests.support.config import free_port as _free_port
from tests.support.config import write_config
from tests.support.process import TIMEOUT

REPO = Path(__file__).resolve().parents[2]

# What a hostile client can get stored: ESC sequences (title, colours), a C1 CSI, DEL,
# a right-to-left override, and bytes that are not UTF-8 (kept via surrogateescape).
SENDER = '"a\x1b]0;owned\x07b"@example.test'
RCPT = b"r\xc2\x9b31m\x7f@ev\xe2\x80\xaeil.test\xff".decode("utf-8", "surrogateescape")
REASON = "450 4.2.0 busy\r\n\x1b[2J\x1b[Hall clear"
UNSAFE = [b"\x1b", b"\x07", b"\x7f", b"\xc2\x9b", b"\xe2\x80\xae", b"\xff", b"\r"]


def _qmgrd(cfg: Path, *args: str) -> bytes:
    result = subprocess.run(
        [sys.executable, "-m", "qmgrd", "-c", str(cfg), *args],
        cwd=REPO,
        capture_output=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == b""
    return result.stdout


def _hostile_spool(tmp_path: Path) -> tuple[Path, str]:
    cfg = write_config(tmp_path, listen=f"127.0.0.1:{_free_port()}")
    spool = Spool(tmp_path / "spool", fsync=False)
    spool.ensure_dirs()
    qid = spool.commit(
        Envelope(SENDER, (RecipientSpec(RCPT),), 1_700_000_000.0), b"Subject: x\r\n\r\nx\r\n"
    )
    spool.move(qid, "incoming", "deferred")
    spool.append_reasons("defer", qid, [ReasonRecord(RCPT, "4.2.0", "delayed", REASON, 1e9)])
    return cfg, qid


def test_mailq_text_escapes_control_bytes_in_addresses_and_reasons(tmp_path: Path) -> None:
    """The text listing shows \\x1b, \\u009b, \\xff ... instead of the bytes themselves."""
    cfg, qid = _hostile_spool(tmp_path)
    out = _qmgrd(cfg, "mailq")
    for byte in UNSAFE:
        assert byte not in out, byte
    lines = out.decode("utf-8").splitlines()
    assert lines[1].startswith(qid) and lines[1].endswith('"a\\x1b]0;owned\\x07b"@example.test')
    reason = "(450 4.2.0 busy\\r\\n\\x1b[2J\\x1b[Hall clear)"
    assert lines[2] == reason.rjust(78)  # right-aligned to column 78, as Postfix
    assert lines[3].strip() == "r\\u009b31m\\x7f@ev\\u202eil.test\\xff"


def test_mailq_json_is_safe_and_exact(tmp_path: Path) -> None:
    """--json escapes the same characters as JSON \\u escapes, which decode to the stored value."""
    cfg, qid = _hostile_spool(tmp_path)
    out = _qmgrd(cfg, "mailq", "--json")
    for byte in UNSAFE:
        assert byte not in out, byte
    obj = json.loads(out.decode("utf-8"))
    assert obj["queue_id"] == qid
    assert obj["sender"] == SENDER
    assert obj["recipients"] == [{"address": RCPT, "delay_reason": REASON}]


def test_qshape_escapes_control_bytes_in_domains(tmp_path: Path) -> None:
    """qshape's domain column shows the escaped domain, still counted once."""
    cfg, _qid = _hostile_spool(tmp_path)
    out = _qmgrd(cfg, "qshape", "deferred")
    for byte in UNSAFE:
        assert byte not in out, byte
    rows = [line.split()[:2] for line in out.decode("utf-8").splitlines()[1:]]
    assert rows == [["TOTAL", "1"], ["ev\\u202eil.test\\xff", "1"]]
