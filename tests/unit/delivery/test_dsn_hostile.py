"""Bounces of hostile or broken originals: never hang, never raise, always a valid DSN.

The original is untrusted input: it is attached as bytes (never parsed or
re-serialised), within ``bounce_size_limit``. Every composition here runs in a
helper thread with a time bound, so a regression to an endless loop fails the
test instead of hanging the suite.
"""

from __future__ import annotations

import email
import email.parser
import email.policy
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import Message

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qmgrd.delivery.dsn import DsnRecipient, compose_dsn
from qmgrd.delivery.dsncopy import choose_boundary

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
BOUND = 10.0  # seconds; a correct composition of these inputs takes milliseconds

#: CPython gh-138223: folding this header loops for ever.
FOLDING_LOOP = b"From: a@example.org\r\nContent-Type: text/plain;\r\n " + b"p" * 80 + b"=y\r\n"
#: A multipart without a boundary and an 8-bit body: re-serialising it raised.
NO_BOUNDARY = (
    b"From: a@example.org\r\nMIME-Version: 1.0\r\nContent-Type: multipart/mixed\r\n\r\n"
    b"caf\xe9 au lait\r\n"
)
#: A 70-character MIME-Version value ending in a Latin-1 byte: re-serialising it raised.
LONG_MIME_VERSION = b"From: a@example.org\r\nMIME-Version: " + b"1" * 69 + b"\xe9\r\n\r\nhi\r\n"


def _rcpt(address: str = "b@example.com", diagnostic: str | None = None) -> DsnRecipient:
    return DsnRecipient(
        address,
        "failed",
        "5.1.1",
        diagnostic_code=diagnostic if diagnostic is not None else "550 5.1.1 user unknown",
        remote_mta="mx.example.com",
    )


def _within(seconds: float, work: Callable[[], bytes]) -> bytes:
    """Run ``work`` in a daemon thread; fail if it takes longer than ``seconds``."""
    result: list[bytes] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            result.append(work())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"compose_dsn did not finish within {seconds} s")
    if errors:
        raise errors[0]
    return result[0]


def _compose(
    original: bytes,
    *,
    full: bool = True,
    limit: int | None = None,
    recipients: list[DsnRecipient] | None = None,
) -> bytes:
    def work() -> bytes:
        rcpts = recipients or [_rcpt()]
        message = original if full else None
        if limit is None:  # Postfix's default, as the engine gets it without the keyword
            return compose_dsn(
                reporting_mta="mx.example.org",
                queue_id="3F9A2B",
                original_sender="a@example.org",
                arrival_time=NOW,
                recipients=rcpts,
                original_headers=original,
                original_message=message,
                now=NOW,
            )
        return compose_dsn(
            reporting_mta="mx.example.org",
            queue_id="3F9A2B",
            original_sender="a@example.org",
            arrival_time=NOW,
            recipients=rcpts,
            original_headers=original,
            original_message=message,
            now=NOW,
            bounce_size_limit=limit,
        )

    return _within(BOUND, work)


@dataclass(frozen=True, slots=True)
class Part:
    """One body part of a parsed DSN: its MIME header and its raw content."""

    header: Message
    content: bytes


@dataclass(frozen=True, slots=True)
class Dsn:
    """A DSN split by its own boundary, checked for wire validity on the way."""

    header: Message
    parts: tuple[Part, Part, Part]

    def status_groups(self) -> list[Message]:
        """The delivery-status field groups, parsed by the email package (our bytes only)."""
        msg = email.message_from_bytes(
            b"Content-Type: message/delivery-status\r\n\r\n" + self.parts[1].content,
            policy=email.policy.default,
        )
        groups = msg.get_payload()
        assert isinstance(groups, list)
        return [g for g in groups if isinstance(g, Message)]

    def text(self) -> str:
        """The human-readable part, decoded with its declared charset."""
        charset = self.parts[0].header.get_param("charset")
        assert isinstance(charset, str)
        return self.parts[0].content.decode(charset)


def _header(raw: bytes) -> Message:
    return email.parser.BytesHeaderParser(policy=email.policy.default).parsebytes(raw)


def _split(raw: bytes, limit: int = 50000) -> Dsn:
    """Check the wire rules (CRLF, <= 998, no NUL, CTE honest) and split by the boundary."""
    assert raw.endswith(b"\r\n")
    assert b"\r" not in raw.replace(b"\r\n", b"") and b"\n" not in raw.replace(b"\r\n", b"")
    assert b"\0" not in raw
    assert max(len(line) for line in raw.split(b"\r\n")) <= 998
    head, sep, body = raw.partition(b"\r\n\r\n")
    assert sep
    top = _header(head + b"\r\n\r\n")
    assert top.get_content_type() == "multipart/report"
    assert top.get_param("report-type") == "delivery-status"
    boundary = top.get_boundary()
    assert boundary
    segments = body.split(b"\r\n--" + boundary.encode("ascii"))
    # preamble, three parts, close delimiter: any other count means the boundary collided
    assert len(segments) == 5, f"{len(segments)} segments"
    assert segments[4] == b"--\r\n"
    parts: list[Part] = []
    eight_bit = False
    for segment in segments[1:4]:
        assert segment.startswith(b"\r\n")
        part_head, sep, content = segment[2:].partition(b"\r\n\r\n")
        assert sep
        header = _header(part_head + b"\r\n\r\n")
        cte = header["Content-Transfer-Encoding"]
        assert cte == ("7bit" if content.isascii() else "8bit")
        eight_bit |= not content.isascii()
        parts.append(Part(header, content))
    assert top["Content-Transfer-Encoding"] == ("8bit" if eight_bit else "7bit")
    assert [p.header.get_content_type() for p in parts[:2]] == [
        "text/plain",
        "message/delivery-status",
    ]
    assert parts[2].header.get_content_type() in ("message/rfc822", "text/rfc822-headers")
    assert len(parts[2].content) <= limit
    return Dsn(top, (parts[0], parts[1], parts[2]))


def test_folding_loop_header_composes_in_bounded_time() -> None:
    """The gh-138223 header (80-character parameter name) bounces within the time bound."""
    original = FOLDING_LOOP + b"\r\nbody\r\n"
    dsn = _split(_compose(original))
    assert dsn.parts[2].header.get_content_type() == "message/rfc822"
    assert dsn.parts[2].content == original


def test_multipart_without_boundary_with_8bit_body_does_not_raise() -> None:
    """A multipart/mixed without boundary and an 8-bit body is attached as is, declared 8bit."""
    dsn = _split(_compose(NO_BOUNDARY))
    assert dsn.parts[2].content == NO_BOUNDARY
    assert dsn.parts[2].header["Content-Transfer-Encoding"] == "8bit"


def test_long_mime_version_with_latin1_byte_does_not_raise() -> None:
    """A 70-character MIME-Version ending in a Latin-1 byte is attached, full or headers only."""
    assert _split(_compose(LONG_MIME_VERSION)).parts[2].content == LONG_MIME_VERSION
    headers = _split(_compose(LONG_MIME_VERSION, full=False)).parts[2]
    assert headers.header.get_content_type() == "text/rfc822-headers"
    assert headers.content == LONG_MIME_VERSION.partition(b"\r\n\r\n")[0] + b"\r\n"


def test_report_fields_are_intact_next_to_a_hostile_original() -> None:
    """Recipients, status codes and diagnostics survive whatever the attached original holds."""
    dsn = _split(
        _compose(
            FOLDING_LOOP + NO_BOUNDARY,
            recipients=[_rcpt("b@example.com"), _rcpt("c@example.com", "552 5.2.2 over quota")],
        )
    )
    _per_message, first, second = dsn.status_groups()
    assert first["Final-Recipient"] == "rfc822; b@example.com"
    assert first["Status"] == "5.1.1"
    assert first["Diagnostic-Code"] == "smtp; 550 5.1.1 user unknown"
    assert second["Final-Recipient"] == "rfc822; c@example.com"
    assert second["Diagnostic-Code"] == "smtp; 552 5.2.2 over quota"
    assert "<c@example.com>: 552 5.2.2 over quota" in dsn.text()


def test_original_within_limit_is_attached_whole() -> None:
    """An original no larger than bounce_size_limit is attached whole as message/rfc822."""
    original = b"Subject: x\r\n\r\n" + b"y" * 84 + b"\r\n"
    assert len(original) == 100
    part = _split(_compose(original, limit=100), limit=100).parts[2]
    assert part.header.get_content_type() == "message/rfc822"
    assert part.header["Content-Description"] == "Undelivered Message"
    assert part.content == original


def test_original_over_limit_gets_headers_only() -> None:
    """An original larger than bounce_size_limit is returned as its headers only (Postfix)."""
    original = b"Subject: x\r\nFrom: a@example.org\r\n\r\n" + b"y" * 200 + b"\r\n"
    part = _split(_compose(original, limit=100), limit=100).parts[2]
    assert part.header.get_content_type() == "text/rfc822-headers"
    assert part.header["Content-Description"] == "Undelivered Message Headers"
    assert part.content == b"Subject: x\r\nFrom: a@example.org\r\n"


def test_default_limit_is_postfix_50000() -> None:
    """Without a limit argument a 50,000-byte original is whole and a 50,001-byte one is not."""
    line = b"y" * 98 + b"\r\n"
    fits = b"Subject: x\r\n\r\n" + line * 499 + b"z" * 84 + b"\r\n"
    assert len(fits) == 50000
    assert _split(_compose(fits)).parts[2].header.get_content_type() == "message/rfc822"
    over = fits + b"z"
    assert _split(_compose(over)).parts[2].header.get_content_type() == "text/rfc822-headers"


def test_empty_original_gets_an_empty_headers_part() -> None:
    """An empty original is returned as an empty text/rfc822-headers part, as Postfix does."""
    part = _split(_compose(b"")).parts[2]
    assert part.header.get_content_type() == "text/rfc822-headers"
    assert part.content == b""


def test_ret_hdrs_attaches_headers_only() -> None:
    """Without the full content (RET=HDRS, delay notices) only the header section is attached."""
    original = b"Subject: x\r\n\tcontinued\r\nTo: b@example.com\r\n\r\nSecret body\r\n"
    part = _split(_compose(original, full=False)).parts[2]
    assert part.header.get_content_type() == "text/rfc822-headers"
    assert part.content == b"Subject: x\r\n\tcontinued\r\nTo: b@example.com\r\n"


def test_headers_only_stops_at_first_non_header_line() -> None:
    """Headers end at the first line that is neither a field nor a continuation (Postfix)."""
    original = b"Subject: x\r\nthis is body text without a blank line\r\nTo: b@x\r\n"
    part = _split(_compose(original, full=False)).parts[2]
    assert part.content == b"Subject: x\r\n"


def test_huge_header_section_is_truncated_at_a_line_boundary() -> None:
    """A header section larger than the limit is cut after the last whole line that fits."""
    original = b"".join(b"X-H%04d: %s\r\n" % (i, b"v" * 50) for i in range(100)) + b"\r\nb\r\n"
    part = _split(_compose(original, limit=1000), limit=1000).parts[2]
    assert part.header.get_content_type() == "text/rfc822-headers"
    assert part.content.endswith(b"\r\n") and len(part.content) > 900
    assert original.startswith(part.content)


def test_long_lines_are_broken_and_line_ends_made_crlf() -> None:
    """Lines over 998 octets are broken with CRLF SP; LF-only ends become CRLF."""
    original = b"Subject: " + b"s" * 3000 + b"\nTo: b@x\n\n" + b"q" * 2500 + b"\n"
    content = _split(_compose(original)).parts[2].content
    assert content.replace(b"\r\n ", b"").replace(b"\r\n", b"\n") == original


def test_nul_and_bare_cr_are_masked() -> None:
    """NUL and bare CR (not allowed in 8bit content) are replaced by '?'."""
    original = b"Subject: a\0b\rc\r\n\r\nbody\0\r\n"
    content = _split(_compose(original)).parts[2].content
    assert content == b"Subject: a?b?c\r\n\r\nbody?\r\n"


def test_seven_bit_original_is_declared_7bit() -> None:
    """An all-ASCII original and report are declared 7bit, top level included."""
    dsn = _split(_compose(b"Subject: plain\r\n\r\nascii\r\n"))
    assert dsn.header["Content-Transfer-Encoding"] == "7bit"
    assert dsn.parts[2].header["Content-Transfer-Encoding"] == "7bit"


def test_boundary_in_the_original_is_avoided() -> None:
    """An original that contains a boundary candidate makes the composer pick another."""
    digests = iter(["aaaa", "aaaa", "bbbb"])
    parts = [b"x\r\n--seed/aaaa\r\n", b"y"]
    boundary = choose_boundary("seed", parts, digest=lambda _i, _parts: next(digests))
    assert boundary == "seed/bbbb"


def test_original_quoting_our_own_boundary_style_does_not_collide() -> None:
    """An original that embeds Postfix-style boundaries for this queue ID still splits in 3."""
    guesses = b"".join(
        b"--3F9A2B.%d/mx.example.org\r\n" % (int(NOW.timestamp()) + i) for i in range(-2, 3)
    )
    _split(_compose(b"Subject: x\r\n\r\n" + guesses))


def test_hostile_diagnostic_text_stays_in_its_field() -> None:
    """A remote reply with CR/LF, controls, 8-bit and 5,000 characters cannot inject fields."""
    diagnostic = "550 bad\r\nX-Injected: yes\x00\x1b[31m caf\u00e9 \udce9 " + "w" * 5000 + " end"
    dsn = _split(_compose(b"Subject: x\r\n\r\n", recipients=[_rcpt(diagnostic=diagnostic)]))
    block = dsn.status_groups()[1]
    assert block["X-Injected"] is None
    code = block["Diagnostic-Code"]
    assert code.startswith("smtp; 550 bad X-Injected: yes?") and code.endswith(" end")
    assert "X-Injected: yes" in dsn.text() and "\x1b" not in dsn.text()
    assert dsn.parts[1].content.isascii()


def test_non_ascii_recipient_uses_utf8_address_type() -> None:
    """An internationalised recipient is reported as utf-8 address xtext (RFC 6533)."""
    dsn = _split(_compose(b"Subject: x\r\n\r\n", recipients=[_rcpt("j\u00f6rg@example.com")]))
    assert dsn.status_groups()[1]["Final-Recipient"] == "utf-8; j\\x{F6}rg@example.com"
    assert "<j\u00f6rg@example.com>" in dsn.text()
    assert dsn.parts[0].header.get_param("charset") == "utf-8"


@pytest.mark.parametrize("full", [True, False])
def test_megabytes_of_header_soup_compose_in_bounded_time(full: bool) -> None:
    """4 MB of folded, 8-bit, NUL-laden header lines (no blank line) bounce within the bound."""
    line = b"X-Soup: \xff\0" + b"z" * 60 + b";\r\n " + b"p" * 80 + b"=y\r\n"
    original = line * (4_000_000 // len(line))
    for limit in (50_000, 10_000_000):
        part = _split(_compose(original, full=full, limit=limit), limit=limit).parts[2]
        assert part.header.get_content_type() == "text/rfc822-headers" or limit > len(original)


_HEADER_LINES = st.one_of(
    st.binary(max_size=200),
    st.binary(min_size=900, max_size=2500),
    st.sampled_from(
        [
            FOLDING_LOOP,
            b"Content-Type: multipart/mixed",
            b"Content-Type: multipart/alternative; boundary=",
            b"Content-Transfer-Encoding: base64",
            b"MIME-Version: " + b"1" * 69 + b"\xe9",
            b"Subject: =?utf-8?q?=E9=ZZ?=",
            b'To: "\\" <@>,,,;;',
            b" continuation",
            b"\tcontinuation \xc3",
            b"X-Nul: \0\0\0",
            b"",
        ]
    ),
    st.text(max_size=120).map(lambda t: t.encode("utf-8", "surrogatepass")),
)


@st.composite
def _originals(draw: st.DrawFn) -> bytes:
    lines = draw(st.lists(_HEADER_LINES, max_size=25))
    ends = draw(st.sampled_from([b"\r\n", b"\n", b"\r"]))
    body = draw(st.binary(max_size=3000))
    return ends.join(lines) + draw(st.sampled_from([b"\r\n\r\n", b"\n\n", b""])) + body


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    original=_originals(),
    full=st.booleans(),
    limit=st.sampled_from([1, 80, 1000, 50000]),
    diagnostic=st.text(max_size=300),
)
def test_random_header_soup_always_gives_a_valid_dsn(
    original: bytes, full: bool, limit: int, diagnostic: str
) -> None:
    """Random broken originals and replies never raise, finish in time and give a valid DSN."""
    rcpts = [_rcpt("b@example.com", diagnostic), _rcpt("c@example.com")]
    dsn = _split(_compose(original, full=full, limit=limit, recipients=rcpts), limit=limit)
    _per_message, first, second = dsn.status_groups()
    assert first["Final-Recipient"] == "rfc822; b@example.com"
    assert second["Final-Recipient"] == "rfc822; c@example.com"
    assert first["Status"] == second["Status"] == "5.1.1"
    assert first["Action"] == "failed"
    assert second["Diagnostic-Code"] == "smtp; 550 5.1.1 user unknown"
    if dsn.parts[2].header.get_content_type() == "message/rfc822":
        assert full and len(original) <= limit
