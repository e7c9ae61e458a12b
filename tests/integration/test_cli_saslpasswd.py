"""`qmgrd saslpasswd` prints a password-file line that the listener's verifier accepts."""

from __future__ import annotations

import io

import pytest

from qmgrd.cli import main
from qmgrd.listener.auth import parse_password_file


def test_saslpasswd_line_verifies(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The printed USER:HASH line parses, verifies the password and rejects another."""
    monkeypatch.setattr("sys.stdin", io.StringIO("s3cret\n"))
    assert main(["saslpasswd", "alice", "--stdin"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("alice:$pbkdf2-sha256$")
    creds = parse_password_file(line + "\n", "test")
    assert creds.verify("alice", "s3cret")
    assert not creds.verify("alice", "wrong")
