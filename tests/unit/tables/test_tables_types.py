"""Each lookup table type against Postfix's documented examples, and every error message."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from qmgrd.errors import ConfigError
from qmgrd.tables import LookupTable, index_path, open_table, postmap


@pytest.fixture(autouse=True)
def recheck_every_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables look at their files at every lookup here (normally at most once a second)."""
    monkeypatch.setattr("qmgrd.tables.base.RECHECK_INTERVAL", 0.0)


# regexp_table(5), "EXAMPLE SMTPD ACCESS MAP"
REGEXP_EXAMPLE = """\
# Disallow sender-specified routing. This is a must if you relay mail
# for other domains.
/[%!@].*[%!@]/       550 Sender-specified routing rejected

# Postmaster is OK, that way they can talk to us about how to fix
# their problem.
/^postmaster@/       OK

# Protect your outgoing majordomo exploders
if !/^owner-/
/^(.*)-outgoing@(.*)$/  550 Use ${1}@${2} instead
endif
"""

# cidr_table(5), "EXAMPLE SMTPD ACCESS MAP"
CIDR_EXAMPLE = """\
# Rule order matters. Put more specific allowlist entries
# before more general denylist entries.
192.168.1.1             OK
192.168.0.0/16          REJECT
2001:db8::1             OK
2001:db8::/32           REJECT
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def error_of(spec: str, base: Path) -> str:
    with pytest.raises(ConfigError) as info:
        open_table(spec, base_dir=base)
    return str(info.value)


def bump(path: Path, text: str) -> None:
    """Rewrite ``path`` with a visibly newer mtime (no sleeping: set it explicitly)."""
    old = os.stat(path).st_mtime_ns
    path.write_text(text)
    os.utime(path, ns=(old + 2_000_000_000, old + 2_000_000_000))


# --- inline, static ---


def test_inline_keys_are_case_insensitive_values_kept() -> None:
    """inline: folds keys, keeps values as written, and braces hold blanks and commas."""
    t = open_table("inline:{ A.example=smtp:[X], { b = text, with commas } }", base_dir=Path("/"))
    assert t.lookup("a.EXAMPLE") == "smtp:[X]"
    assert t.lookup("B") == "text, with commas"
    assert t.lookup("c") is None


def test_static_returns_its_value_for_every_key() -> None:
    """static: answers every key, and static:{...} keeps blanks."""
    assert open_table("static:relay:[h]", base_dir=Path("/")).lookup("anything") == "relay:[h]"
    assert open_table("static:{ a b }", base_dir=Path("/")).lookup("x") == "a b"


# --- texthash and re-reading ---


def test_texthash_relative_path_continuation_and_reload(tmp_path: Path) -> None:
    """texthash: is relative to base_dir, joins continuation lines, and re-reads a changed file."""
    path = write(tmp_path, "t", "# comment\nuser@Example.com  smtp:\n   [relay]\nother x\n")
    t = open_table("texthash:t", base_dir=tmp_path)
    assert t.lookup("USER@example.com") == "smtp: [relay]"
    bump(path, "other y\n")
    assert t.lookup("other") == "y"
    assert t.lookup("user@example.com") is None


def test_texthash_broken_edit_keeps_previous_contents(tmp_path: Path) -> None:
    """A changed file that no longer parses keeps the old contents in use (not a crash)."""
    path = write(tmp_path, "t", "a 1\n")
    t = open_table(f"texthash:{path}", base_dir=tmp_path)
    bump(path, "lonely\n")
    assert t.lookup("a") == "1"


def test_texthash_duplicate_keeps_first_and_logs(tmp_path: Path) -> None:
    """A duplicate key keeps the first value, as postmap does, with a logged warning."""
    write(tmp_path, "t", "a 1\nA 2\n")
    with capture_logs() as logs:
        assert open_table("texthash:t", base_dir=tmp_path).lookup("a") == "1"
    assert [(e["log_level"], e["event"]) for e in logs] == [
        ("warning", f"{tmp_path / 't'}, line 2: duplicate entry: 'a' (ignored)")
    ]


def test_broken_edit_is_logged_once(tmp_path: Path) -> None:
    """A changed file that does not parse is logged once per version, not at every lookup."""
    path = write(tmp_path, "t", "a 1\n")
    t = open_table("texthash:t", base_dir=tmp_path)
    bump(path, "lonely\n")
    with capture_logs() as logs:
        assert t.lookup("a") == "1"
        assert t.lookup("a") == "1"
    assert len(logs) == 1
    assert logs[0]["log_level"] == "error"
    assert "line 1: expected format: key whitespace value" in logs[0]["event"]
    assert "still using the previous contents" in logs[0]["event"]


# --- hash / lmdb ---


def test_hash_needs_postmap_then_finds_keys(tmp_path: Path) -> None:
    """hash: refuses a missing index with the postmap hint; after postmap it answers."""
    source = write(tmp_path, "transport", "Example.com smtp:[mx.example.com]:2525\n")
    assert "run: qmgrd postmap" in error_of("hash:transport", tmp_path)
    assert postmap(source) == (1, [])
    for kind in ("hash", "lmdb"):
        t = open_table(f"{kind}:transport", base_dir=tmp_path)
        assert t.lookup("EXAMPLE.COM") == "smtp:[mx.example.com]:2525"
        assert t.lookup("other") is None


def test_hash_reopens_a_rebuilt_index(tmp_path: Path) -> None:
    """A new postmap run is seen by an open table without a reload."""
    source = write(tmp_path, "m", "a 1\n")
    postmap(source)
    t = open_table("hash:m", base_dir=tmp_path)
    assert t.lookup("a") == "1"
    source.write_text("a 2\n")
    postmap(source)
    idx = index_path(source)
    st = os.stat(idx)
    os.utime(idx, ns=(st.st_mtime_ns + 2_000_000_000, st.st_mtime_ns + 2_000_000_000))
    assert t.lookup("a") == "2"


def test_hash_index_older_than_source_is_refused(tmp_path: Path) -> None:
    """An index older than its source is an error saying to run postmap."""
    source = write(tmp_path, "m", "a 1\n")
    postmap(source)
    st = os.stat(index_path(source))
    os.utime(source, ns=(st.st_mtime_ns + 5_000_000_000, st.st_mtime_ns + 5_000_000_000))
    assert "is older than source file" in error_of("hash:m", tmp_path)


def test_hash_foreign_index_is_refused(tmp_path: Path) -> None:
    """A file that is not a qmgrd index (e.g. Berkeley DB) is refused with the postmap hint."""
    source = write(tmp_path, "m", "a 1\n")
    index_path(source).write_bytes(b"\x00\x06\x15\x61 not sqlite" * 10)
    os.utime(source, ns=(0, 0))
    assert "is not a qmgrd index" in error_of("hash:m", tmp_path)


def test_postmap_malformed_line_names_file_and_line(tmp_path: Path) -> None:
    """postmap of a key without a value names the file and the line, and writes no index."""
    source = write(tmp_path, "m", "a 1\n\nlonely\n")
    with pytest.raises(ConfigError, match=r"m, line 3: expected format: key whitespace value"):
        postmap(source)
    assert not index_path(source).exists()


def test_postmap_reports_duplicates(tmp_path: Path) -> None:
    """postmap warns about a duplicate key, naming its line."""
    source = write(tmp_path, "m", "a 1\na 2\n")
    count, warnings = postmap(source)
    assert count == 1
    assert warnings == [f"{source}, line 2: duplicate entry: 'a' (ignored)"]


# --- regexp / pcre ---


@pytest.mark.parametrize("kind", ["regexp", "pcre"])
def test_regexp_documented_example(tmp_path: Path, kind: str) -> None:
    """regexp_table(5)'s access map example gives the documented answers, with $n substitution."""
    write(tmp_path, "r", REGEXP_EXAMPLE)
    t = open_table(f"{kind}:r", base_dir=tmp_path)
    assert t.lookup("a%b@c") == "550 Sender-specified routing rejected"
    assert t.lookup("Postmaster@example.com") == "OK"  # case-insensitive by default
    assert t.lookup("list-outgoing@example.com") == "550 Use list@example.com instead"
    assert t.lookup("owner-list-outgoing@example.com") is None  # inside if !/^owner-/
    assert t.lookup("user@example.com") is None


def test_regexp_flags_and_dollar() -> None:
    """Flag i makes a pattern case-sensitive; $$ is a dollar; an unmatched group is empty."""
    t = open_table(
        "regexp:{ {/^ABC$/i exact}, {/^(x)?y(z)$/ a$$b$1-$(2)} }", base_dir=Path("/")
    )
    assert t.lookup("abc") is None
    assert t.lookup("ABC") == "exact"
    assert t.lookup("yz") == "a$b-z"


def test_regexp_negated_and_posix_class() -> None:
    """A negated rule answers when the pattern does not match; [[:digit:]] works."""
    t = open_table("regexp:{ {/^[[:digit:]]+$/ number}, {!/@/ local} }", base_dir=Path("/"))
    assert t.lookup("123") == "number"
    assert t.lookup("user") == "local"
    assert t.lookup("u@d") is None


def test_pcre_anchored_and_dotall_flags() -> None:
    """pcre flag A anchors at the start; s lets the dot match a newline."""
    t = open_table("pcre:{ {/b/A starts-b}, {/a.c/s dotall} }", base_dir=Path("/"))
    assert t.lookup("ab") is None
    assert t.lookup("bx") == "starts-b"
    assert t.lookup("a\nc") == "dotall"


def test_regexp_other_delimiter(tmp_path: Path) -> None:
    """Any non-alphanumeric delimiter works, as in regexp_table(5)'s body example."""
    write(tmp_path, "r", "~^[[:alnum:]+/]{60,}$~          OK\n#/x/ y\n")
    t = open_table("regexp:r", base_dir=tmp_path)
    assert t.lookup("A" * 60) == "OK"
    assert t.lookup("short") is None


def test_regexp_reload_on_change(tmp_path: Path) -> None:
    """A changed regexp file is re-read at the next lookup."""
    path = write(tmp_path, "r", "/a/ one\n")
    t = open_table("regexp:r", base_dir=tmp_path)
    assert t.lookup("a") == "one"
    bump(path, "/a/ two\n")
    assert t.lookup("a") == "two"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("/a(/ x\n", r"r, line 1: bad regular expression /a\(/"),
        ("/a/ x\n/b/\n", r"r, line 2: missing result after the pattern"),
        ("/a/q x\n", r"r, line 1: unknown flag 'q'"),
        ("/a/x x\n", r"r, line 1: flag x \(POSIX basic syntax\) is not supported"),
        ("/(a)/ $2\n", r"r, line 1: out of range replacement index \$2"),
        ("!/(a)/ $1\n", r"r, line 1: \$number in the result of a negated pattern"),
        ("/a/ $x\n", r"r, line 1: unsupported \$ sequence"),
        ("endif\n", r"r, line 1: endif without a matching if"),
        ("\n\nif /a/\n/b/ c\n", r"r, line 3: if without a matching endif"),
        ("/abc x\n", r"r, line 1: missing closing '/'"),
        ("abc x\n", r"r, line 1: pattern must start with a delimiter"),
        (" /a/ x\n", r"r, line 1: continuation line without a preceding entry"),
        ("if /a/ junk\nendif\n", r"r, line 1: text after the if pattern"),
    ],
)
def test_regexp_errors_name_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    """Every regexp table error names the file and the line and says what is wrong."""
    write(tmp_path, "r", text)
    with pytest.raises(ConfigError, match=message):
        open_table("regexp:r", base_dir=tmp_path)


def test_pcre_ungreedy_flag_refused() -> None:
    """pcre flag U has no Python equivalent and is refused with a hint."""
    assert "flag U (ungreedy) is not supported" in error_of("pcre:{ {/a/U x} }", Path("/"))


# --- cidr ---


def test_cidr_documented_example(tmp_path: Path) -> None:
    """cidr_table(5)'s example: specific entries before general ones, IPv4 and IPv6."""
    write(tmp_path, "c", CIDR_EXAMPLE)
    t = open_table("cidr:c", base_dir=tmp_path)
    assert t.lookup("192.168.1.1") == "OK"
    assert t.lookup("192.168.7.7") == "REJECT"
    assert t.lookup("10.0.0.1") is None
    assert t.lookup("2001:db8::1") == "OK"
    assert t.lookup("2001:0db8:0::2") == "REJECT"  # leading zeros do not matter
    assert t.lookup("[2001:db8::3]") == "REJECT"
    assert t.lookup("not-an-address") is None


def test_cidr_if_negation_and_brackets() -> None:
    """if/endif, !pattern and [ipv6] patterns work as in Postfix 3.2."""
    t = open_table(
        "cidr:{ {if 10.0.0.0/8}, {10.1.0.0/16 ten-one}, {endif}, {![2001:db8::]/32 not-doc} }",
        base_dir=Path("/"),
    )
    assert t.lookup("10.1.2.3") == "ten-one"
    assert t.lookup("10.2.0.1") == "not-doc"
    assert t.lookup("2001:db8::5") is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("192.168.1.1/24 x\n", r"c, line 1: non-null host address bits in '192.168.1.1/24', "
         r"perhaps you should use 192.168.1.0/24 instead"),
        ("10.0.0.0/33 x\n", r"c, line 1: bad network prefix length"),
        ("host.example x\n", r"c, line 1: bad address pattern 'host.example'"),
        ("# c\n10.0.0.0/8\n", r"c, line 2: missing result after '10.0.0.0/8'"),
        ("endif\n", r"c, line 1: endif without a matching if"),
        ("if 10.0.0.0/8\n", r"c, line 1: if without a matching endif"),
    ],
)
def test_cidr_errors_name_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    """Every cidr table error names the file and the line."""
    write(tmp_path, "c", text)
    with pytest.raises(ConfigError, match=message):
        open_table("cidr:c", base_dir=tmp_path)


# --- open_table errors ---


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("btree:/x", "unsupported lookup table type 'btree'"),
        ("nospec", "expected a lookup table as type:name"),
        ("texthash:", "missing table name after texthash:"),
        ("texthash:/nonexistent/t", "/nonexistent/t: table file not found"),
        ("inline:{ a }", "element 1: expected key=value"),
        ("inline:a=b", "expected inline:{ ... }"),
        ("inline:{ a=b", "expected inline:{ ... }"),
        ("hash:{ a=b }", "a hash table needs a file name"),
    ],
)
def test_open_table_errors(spec: str, message: str) -> None:
    """A bad table specification is a ConfigError that says what is wrong."""
    assert message in error_of(spec, Path("/"))


def test_every_type_satisfies_the_protocol(tmp_path: Path) -> None:
    """Every table type is a LookupTable whose spec is the text as written."""
    write(tmp_path, "t", "a b\n")
    postmap(tmp_path / "t")
    specs = [
        "inline:{a=b}", "static:x", "texthash:t", "hash:t", "lmdb:t",
        "regexp:{ {/a/ b} }", "pcre:{ {/a/ b} }", "cidr:{ {10.0.0.0/8 b} }",
    ]
    for spec in specs:
        table = open_table(spec, base_dir=tmp_path)
        assert isinstance(table, LookupTable)
        assert table.spec == spec


def test_file_is_looked_at_once_per_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the default interval a change is seen only once a second has passed (fake clock)."""
    now = [1000.0]
    monkeypatch.setattr("qmgrd.tables.base.RECHECK_INTERVAL", 1.0)
    monkeypatch.setattr("qmgrd.tables.base.monotonic", lambda: now[0])
    path = write(tmp_path, "t", "a 1\n")
    t = open_table("texthash:t", base_dir=tmp_path)
    bump(path, "a 2\n")
    now[0] += 0.5
    assert t.lookup("a") == "1"
    now[0] += 0.6
    assert t.lookup("a") == "2"


def test_index_with_unknown_format_is_refused(tmp_path: Path) -> None:
    """An SQLite file that postmap did not write is refused with the postmap hint."""
    import sqlite3

    source = write(tmp_path, "m", "a 1\n")
    con = sqlite3.connect(index_path(source))
    con.execute("CREATE TABLE meta(name TEXT PRIMARY KEY, value TEXT)")
    con.commit()
    con.close()
    os.utime(source, ns=(0, 0))
    assert "has an unknown format (run: qmgrd postmap" in error_of("hash:m", tmp_path)


def test_postmap_write_failure_names_the_index_and_leaves_no_temporary(tmp_path: Path) -> None:
    """A failed index write is an error naming the index; no temporary file is left behind."""
    source = write(tmp_path, "m", "a 1\n")
    index_path(source).mkdir()  # os.replace onto a directory fails, even for root
    with pytest.raises(ConfigError, match=r"m\.qmgrd\.db: cannot write the index"):
        postmap(source)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m", "m.qmgrd.db"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("regexp:{ {!} }", "missing pattern"),
        ("regexp:{ {endif x} }", "text after endif"),
        ("cidr:{ {if} }", "missing pattern after if"),
        ("cidr:{ {if 10.0.0.0/8 x}, {endif} }", "text after the if pattern"),
        ("cidr:{ {10.0.0.0/x y} }", "bad network prefix length"),
    ],
)
def test_more_pattern_table_errors(spec: str, message: str) -> None:
    """The remaining rule errors of regexp and cidr tables say what is wrong."""
    assert message in error_of(spec, Path("/"))
