"""Outbound filter (smtp_generic_maps, smtp_header_checks): bounded and exact."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from qmgrd.cleanup.checks import open_header_checks
from qmgrd.cleanup.outbound import Outbound
from qmgrd.tables import open_table

ROOT = Path("/")


def outbound(limit: int = 102400) -> Outbound:
    generic = open_table("inline:{ root@h.example=admin@example.com }", base_dir=ROOT)
    checks = open_table("regexp:{{/^X-Drop:/ IGNORE}}", base_dir=ROOT)
    return Outbound(
        generic_maps=(generic,),
        header_checks=open_header_checks([checks], "smtp_header_checks", ROOT, outbound=True),
        header_size_limit=limit,
    )


def run(o: Outbound, data: bytes, chunk: int = 0) -> bytes:
    f = o.filter("Q")
    if not chunk:
        return f.feed(data) + f.finish()
    out = b"".join(f.feed(data[i : i + chunk]) for i in range(0, len(data), chunk))
    return out + f.finish()


def test_envelope_address_generic_order() -> None:
    """generic(5): the full address matches; others and the null sender are unchanged."""
    o = outbound()
    assert o.address("root@h.example") == "admin@example.com"
    assert o.address("other@h.example") == "other@h.example"
    assert o.address("") == ""
    assert not Outbound().active


def test_headers_rewritten_body_untouched() -> None:
    """Address headers are rewritten, IGNORE drops a header, the body is kept byte for byte."""
    msg = b"From: root@h.example\r\nX-Drop: 1\r\nSubject: root@h.example\r\n\r\nroot@h.example\r\n"
    assert run(outbound(), msg) == (
        b"From: admin@example.com\r\nSubject: root@h.example\r\n\r\nroot@h.example\r\n"
    )


def test_huge_header_is_truncated_not_rewritten() -> None:
    """A header over header_size_limit is cut and passed unrewritten; the rest follows intact."""
    msg = b"To: root@h.example, " + b"x" * 5000 + b"\r\nSubject: s\r\n\r\nbody"
    out = run(outbound(limit=1000), msg, chunk=300)
    assert len(out) < 1100
    assert out.startswith(b"To: root@h.example, xxx")
    assert out.endswith(b"\r\nSubject: s\r\n\r\nbody")


@given(st.binary(max_size=2000), st.integers(min_value=1, max_value=300))
@settings(max_examples=200, deadline=None)
def test_random_content_never_raises(data: bytes, chunk: int) -> None:
    """Any bytes, any chunking: no exception and the same output as in one piece."""
    o = outbound(limit=200)
    assert run(o, data, chunk) == run(o, data)
