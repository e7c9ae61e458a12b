"""HeaderProcessor: Received, hops, missing headers, rewriting, header_checks, bad headers."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from qmgrd.cleanup import (
    AddressRewriter,
    CleanupSettings,
    Disposition,
    HeaderProcessor,
    MessageInfo,
    open_header_checks,
)
from qmgrd.tables import open_table

ROOT = Path("/")
NOW = 1_700_000_000.0  # Tue, 14 Nov 2023 22:13:20 UTC
QID = "ABCDEFGHIJKLMNO"


def make_settings(checks: str = "", **kwargs: object) -> CleanupSettings:
    rewriter = AddressRewriter(myorigin="host.example", mydomain="example")
    tables = [open_table(checks, base_dir=ROOT)] if checks else []
    hc = open_header_checks(tables, "header_checks", ROOT)
    return CleanupSettings(
        myhostname="host.example",
        mail_name="qmgrd",
        rewriter=rewriter,
        header_checks=hc,
        **kwargs,  # type: ignore[arg-type]
    )


def info(local: bool = True, recipients: tuple[str, ...] = ("rcpt@dest.example",)) -> MessageInfo:
    return MessageInfo(
        queue_id=QID,
        sender="root@host.example",
        recipients=recipients,
        now=NOW,
        local=local,
        helo="client.example",
        client_name="localhost",
        client_addr="127.0.0.1",
    )


def run(
    message: bytes, s: CleanupSettings | None = None, i: MessageInfo | None = None, chunk: int = 0
) -> tuple[bytes, HeaderProcessor]:
    p = HeaderProcessor(s or make_settings(), i or info())
    out = bytearray()
    if chunk:
        for k in range(0, len(message), chunk):
            out += p.feed(message[k : k + chunk])
    else:
        out += p.feed(message)
    out += p.finish()
    return bytes(out), p


def headers_of(out: bytes) -> list[bytes]:
    head = out.split(b"\r\n\r\n", 1)[0]
    return head.split(b"\r\n")


def test_received_in_postfix_shape_with_one_recipient() -> None:
    """Received: from HELO (name [addr]) by myhostname (qmgrd) with ESMTP id ID for <rcpt>; date."""
    out, _ = run(b"Subject: x\r\n\r\nbody\r\n")
    assert out.startswith(
        b"Received: from client.example (localhost [127.0.0.1])\r\n"
        b"\tby host.example (qmgrd) with ESMTP id ABCDEFGHIJKLMNO\r\n"
        b"\tfor <rcpt@dest.example>; "
    )


def test_received_has_no_for_with_two_recipients() -> None:
    """Postfix writes "for <rcpt>" only when the message has exactly one recipient."""
    out, _ = run(b"Subject: x\r\n\r\n", i=info(recipients=("a@x.example", "b@x.example")))
    first = out.split(b"\r\nSubject")[0]
    assert b" for <" not in first
    assert b"with ESMTP id ABCDEFGHIJKLMNO; " in first


def test_body_passes_untouched() -> None:
    """Body bytes (8-bit, long lines, header-like lines) are written exactly as they came."""
    body = b"From: not a header\r\n" + b"\xff" * 300_000 + b"\r\nlast"
    out, _ = run(b"Subject: x\r\n\r\n" + body, chunk=4096)
    assert out.endswith(b"\r\n\r\n" + body)


def test_missing_headers_added_for_local_client() -> None:
    """A local message without From/Date/Message-ID gets them (Postfix's forms)."""
    out, p = run(b"Subject: x\r\n\r\nbody\r\n")
    heads = headers_of(out)
    assert b"From: root@host.example" in heads
    assert b"Date: Tue, 14 Nov 2023 22:13:20 +0000 (UTC)" in heads or any(
        h.startswith(b"Date: Tue, 14 Nov 2023") for h in heads
    )
    assert b"Message-Id: <20231114221320.ABCDEFGHIJKLMNO@host.example>" in heads
    assert p.outcome.message_id == "<20231114221320.ABCDEFGHIJKLMNO@host.example>"


def test_no_missing_headers_for_remote_client() -> None:
    """Mail from a non-local client gets no added headers and no header rewriting."""
    out, _ = run(b"From: root\r\nSubject: x\r\n\r\n", i=info(local=False))
    heads = headers_of(out)
    assert b"From: root" in heads
    assert not any(h.startswith((b"Date:", b"Message-Id:")) for h in heads)


def test_always_add_missing_headers_for_remote_client() -> None:
    """always_add_missing_headers = yes adds them for every client."""
    out, _ = run(
        b"Subject: x\r\n\r\n",
        s=make_settings(always_add_missing_headers=True),
        i=info(local=False),
    )
    assert any(h.startswith(b"Message-Id: <") for h in headers_of(out))


def test_undisclosed_recipients_header() -> None:
    """With undisclosed_recipients_header set, a message without To/Cc gets it."""
    s = make_settings(undisclosed_recipients_header="To: undisclosed-recipients:;")
    out, _ = run(b"Subject: x\r\n\r\n", s=s)
    assert b"To: undisclosed-recipients:;" in headers_of(out)
    out, _ = run(b"Cc: a@b.example\r\n\r\n", s=s)
    assert b"To: undisclosed-recipients:;" not in headers_of(out)


def test_message_id_logged() -> None:
    """One message-id=<...> log line per message, with the queue id."""
    with capture_logs() as logs:
        run(b"Message-ID: <abc@x.example>\r\n\r\n")
    found = [e for e in logs if e.get("message_id")]
    assert found == [
        {
            "event": "cleanup",
            "queue_id": QID,
            "message_id": "<abc@x.example>",
            "component": "cleanup",
            "log_level": "info",
        }
    ] or [e["message_id"] for e in found] == ["<abc@x.example>"]


def test_header_addresses_qualified_for_local_client() -> None:
    """Bare local parts in From/To/Cc get @myorigin; phrases and comments are kept."""
    out, _ = run(b'From: "Cron Daemon" <root>\r\nTo: joe (Joe), bob@x.example\r\n\r\n')
    heads = headers_of(out)
    assert b'From: "Cron Daemon" <root@host.example>' in heads
    assert b"To: joe@host.example (Joe), bob@x.example" in heads


def test_drop_headers() -> None:
    """Bcc, Return-Path and Content-Length are removed (message_drop_headers default)."""
    out, _ = run(b"Bcc: secret@x.example\r\nReturn-Path: <a@b>\r\nSubject: s\r\n\r\n")
    heads = headers_of(out)
    assert not any(h.lower().startswith((b"bcc:", b"return-path:")) for h in heads)


@pytest.mark.parametrize(
    ("hops", "disposition"),
    [(49, Disposition.ACCEPT), (50, Disposition.TOO_MANY_HOPS)],
)
def test_hop_count(hops: int, disposition: Disposition) -> None:
    """Received and Delivered-To count; reaching hopcount_limit (50) means 554 5.4.0."""
    msg = b"Received: from x\r\n" * (hops - 1) + b"Delivered-To: a@b\r\n\r\n"
    _, p = run(msg)
    assert p.outcome.disposition is disposition
    if disposition is Disposition.TOO_MANY_HOPS:
        assert p.outcome.reply == "554 5.4.0 Error: too many hops"


def test_hopcount_limit_parameter() -> None:
    """A lower hopcount_limit rejects earlier."""
    _, p = run(b"Received: a\r\nReceived: b\r\n\r\n", s=make_settings(hopcount_limit=2))
    assert p.outcome.disposition is Disposition.TOO_MANY_HOPS


CHECKS = (
    "regexp:{{/^Subject: reject me/ REJECT 5.7.0 go away}, {/^Subject: warn/ WARN watch},"
    " {/^X-Ignore:/ IGNORE}, {/^X-Old: (.*)/ REPLACE X-New: $1},"
    " {/^X-Pre:/ PREPEND X-Added: yes}, {/^X-Hold:/ HOLD held for review},"
    " {/^X-Discard:/ DISCARD dropped}, {/^X-Redirect:/ REDIRECT trap@x.example},"
    " {/^X-Default-Reject:/ REJECT}}"
)


@pytest.mark.parametrize(
    ("header", "disposition", "reply", "present", "absent"),
    [
        (b"Subject: reject me", Disposition.REJECT, "550 5.7.0 go away", b"", b""),
        (
            b"X-Default-Reject: 1",
            Disposition.REJECT,
            "550 5.7.1 message content rejected",
            b"",
            b"",
        ),
        (b"Subject: warn", Disposition.ACCEPT, "", b"Subject: warn", b""),
        (b"X-Ignore: 1", Disposition.ACCEPT, "", b"", b"X-Ignore"),
        (b"X-Old: value", Disposition.ACCEPT, "", b"X-New: value", b"X-Old"),
        (b"X-Pre: 1", Disposition.ACCEPT, "", b"X-Added: yes\r\nX-Pre: 1", b""),
        (b"X-Hold: 1", Disposition.HOLD, "", b"X-Hold: 1", b""),
        (b"X-Discard: 1", Disposition.DISCARD, "", b"", b""),
    ],
)
def test_header_checks_actions(
    header: bytes, disposition: Disposition, reply: str, present: bytes, absent: bytes
) -> None:
    """Each header_checks action has Postfix's effect on the message and the outcome."""
    out, p = run(header + b"\r\n\r\nbody\r\n", s=make_settings(CHECKS))
    assert p.outcome.disposition is disposition
    assert p.outcome.reply == reply
    if present:
        assert present in out
    if absent:
        assert absent not in out


def test_header_checks_redirect() -> None:
    """REDIRECT gives the address that replaces every recipient."""
    _, p = run(b"X-Redirect: 1\r\n\r\n", s=make_settings(CHECKS))
    assert p.outcome.redirect == "trap@x.example"
    assert p.outcome.disposition is Disposition.ACCEPT


def test_header_checks_see_multiline_header() -> None:
    """A folded header is matched as one string with embedded newlines (Postfix)."""
    checks = "regexp:{{/^Subject: a\\n\\tb$/ REJECT folded}}"
    _, p = run(b"Subject: a\r\n\tb\r\n\r\n", s=make_settings(checks))
    assert p.outcome.reply == "550 5.7.1 folded"


def test_missing_separator_inserts_empty_line() -> None:
    """A non-header line ends the header section; an empty line is inserted before it."""
    out, _ = run(b"Subject: x\r\nthis is body\r\nmore\r\n", i=info(local=False))
    assert out.endswith(b"Subject: x\r\n\r\nthis is body\r\nmore\r\n")


def test_eight_bit_header_name_ends_headers() -> None:
    """A line whose name has 8-bit bytes is no header: it starts the body (is_header)."""
    out, _ = run(b"Subject: x\r\nX-\xe9t\xe9: 1\r\nY: 2\r\n\r\n", i=info(local=False))
    assert b"Subject: x\r\n\r\nX-\xe9t\xe9: 1\r\nY: 2\r\n\r\n" in out


def test_eight_bit_header_value_passes() -> None:
    """8-bit bytes in a header value are kept as they are (strict_8bitmime is off)."""
    out, _ = run(b"Subject: caf\xe9\r\n\r\n", i=info(local=False))
    assert b"Subject: caf\xe9\r\n\r\n" in out


def test_one_megabyte_header_line_is_truncated() -> None:
    """A 1 MB header line is cut at header_size_limit; the next header and body stay intact."""
    line = b"X-Long: " + b"a" * 1_000_000 + b"\r\n"
    with capture_logs() as logs:
        out, p = run(line + b"Subject: ok\r\n\r\nbody\r\n", i=info(local=False), chunk=65536)
    assert p.outcome.truncated_headers == 1
    assert len(out) < 102400 + 1000
    assert b"\r\nSubject: ok\r\n\r\nbody\r\n" in out
    assert any("header_size_limit" in e["event"] for e in logs)


def test_many_continuation_lines_truncated() -> None:
    """Continuation lines beyond header_size_limit are dropped with the header kept."""
    msg = b"X-Many: a\r\n" + b"\tcontinued\r\n" * 20000 + b"Subject: ok\r\n\r\n"
    out, p = run(msg, s=make_settings(header_size_limit=1000), i=info(local=False))
    assert p.outcome.truncated_headers == 1
    assert b"\r\nSubject: ok\r\n\r\n" in out
    assert len(out) < 2000


def test_long_body_first_line_without_separator() -> None:
    """A long non-header line ending the headers goes to the body whole, not truncated."""
    junk = b"no header here " * 20000 + b"\r\n"
    out, _ = run(b"Subject: x\r\n" + junk, s=make_settings(header_size_limit=1000), chunk=777)
    assert out.endswith(b"\r\n\r\n" + junk)


def test_no_separator_and_no_body() -> None:
    """A message of headers only (no empty line, no final newline) still ends well-formed."""
    out, _ = run(b"Subject: x", i=info(local=False))
    assert out.endswith(b"Subject: x\r\n")


def test_lf_only_message_keeps_lf() -> None:
    """Added lines use the message's own line ending (LF from a local program)."""
    out, _ = run(b"Subject: x\n\nbody\n")
    assert b"\r" not in out


def test_chunking_does_not_change_output() -> None:
    """The same message fed byte by byte or at once gives the same bytes."""
    msg = b"From: root\r\nSubject: a\r\n b\r\nTo: x\r\n\r\nbody\r\n"
    whole, _ = run(msg)
    bytewise, _ = run(msg, chunk=1)
    assert whole == bytewise


HEADER_LINES = st.one_of(
    st.binary(max_size=300),
    st.sampled_from(
        [b"Subject: x", b"From: root", b"To: a, <b>, (c) d", b"\tcont", b"", b"Received: x"]
    ),
)


@given(
    lines=st.lists(HEADER_LINES, max_size=40),
    chunk=st.integers(min_value=1, max_value=512),
    local=st.booleans(),
)
@settings(max_examples=300, deadline=None)
def test_random_header_soup_never_raises_and_is_bounded(
    lines: list[bytes], chunk: int, local: bool
) -> None:
    """Any bytes: no exception, output bounded by input plus added headers, body preserved."""
    message = b"\r\n".join(lines)
    s = make_settings(CHECKS, header_size_limit=256)
    out, p = run(message, s=s, i=info(local=local), chunk=chunk)
    assert len(out) <= len(message) * 3 + 2000
    assert p.outcome.disposition in set(Disposition)
    again, _ = run(message, s=s, i=info(local=local))
    assert again == out


def test_body_chunks_pass_through_uncopied() -> None:
    """Once the header section has ended, each fed chunk comes back as the same object."""
    p = HeaderProcessor(make_settings(), info(local=False))
    first = p.feed(b"Subject: hi\r\n\r\nbody starts")
    assert first.endswith(b"Subject: hi\r\n\r\nbody starts")
    body = b"more body\r\n" * 10_000
    assert p.feed(body) is body
    assert p.finish() == b""
