"""qmgrd postconf: all / -d / -n / names, raw values, errors and warnings, via the CLI."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from qmgrd.cli import main
from qmgrd.config.params import PARAMS
from qmgrd.config.postconf import PostconfArgs, postconf_command

MASTER = "smtp unix - - n - - smtp\nrelay unix - - n - - smtp\n"


@pytest.fixture
def confdir(tmp_path: Path) -> Path:
    (tmp_path / "main.cf").write_text(
        "myhostname = mx.example\nrelayhost = [$myhostname]\nqmgr_message_active_limit = 5\n"
    )
    (tmp_path / "master.cf").write_text(MASTER)
    return tmp_path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err


def test_all_parameters_sorted_and_unexpanded(
    confdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without flags every parameter is printed once, sorted, with $names as written."""
    code, lines, err = run(capsys, "-c", str(confdir), "postconf")
    assert code == 0 and err == ""
    names = [line.split(" = ", 1)[0] for line in lines]
    assert names == sorted(names)
    assert set(PARAMS) <= set(names)
    assert "relayhost = [$myhostname]" in lines
    assert "smtp_helo_name = $myhostname" in lines
    assert "qmgr_message_active_limit = 5" in lines
    assert "relay_destination_concurrency_limit = $default_destination_concurrency_limit" in lines
    assert "transport_maps = " in lines


def test_defaults(confdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """-d prints the table defaults, ignoring main.cf."""
    code, lines, _ = run(capsys, "-c", str(confdir), "postconf", "-d")
    assert code == 0
    assert "qmgr_message_active_limit = 20000" in lines
    assert "relayhost = " in lines
    assert "maximal_queue_lifetime = 5d" in lines
    assert len(lines) == len(PARAMS)


def test_defaults_work_with_a_broken_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """-d reads no configuration, so it works without one."""
    code, lines, _ = run(
        capsys,
        "-c",
        str(tmp_path / "none"),
        "postconf",
        "-d",
        "mail_name",
        "relay_destination_recipient_limit",
    )
    assert code == 0
    assert lines == [
        "mail_name = qmgrd",
        "relay_destination_recipient_limit = $default_destination_recipient_limit",
    ]


def test_nondefault_only_main_cf(confdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """-n prints exactly the names set in main.cf, sorted, as written."""
    code, lines, _ = run(capsys, "-c", str(confdir), "postconf", "-n")
    assert code == 0
    assert lines == [
        "myhostname = mx.example",
        "qmgr_message_active_limit = 5",
        "relayhost = [$myhostname]",
    ]


def test_named_parameters_in_given_order(confdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With names, only those are printed, in the order given."""
    code, lines, _ = run(
        capsys,
        "-c",
        str(confdir),
        "postconf",
        "soft_bounce",
        "relayhost",
        "smtp_initial_destination_concurrency",
    )
    assert code == 0
    assert lines == [
        "soft_bounce = no",
        "relayhost = [$myhostname]",
        "smtp_initial_destination_concurrency = $initial_destination_concurrency",
    ]


def test_nondefault_with_names_skips_unset(
    confdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """-n with names prints only those of them set in main.cf."""
    code, lines, _ = run(capsys, "-c", str(confdir), "postconf", "-n", "soft_bounce", "relayhost")
    assert code == 0
    assert lines == ["relayhost = [$myhostname]"]


@pytest.mark.parametrize("flags", [[], ["-d"], ["-n"]])
def test_unknown_name_is_an_error(
    confdir: Path, capsys: pytest.CaptureFixture[str], flags: list[str]
) -> None:
    """An unknown parameter name exits 1 with a fatal message and prints nothing."""
    code, lines, err = run(capsys, "-c", str(confdir), "postconf", *flags, "mail_name", "nosuch")
    assert code == 1
    assert lines == []
    assert err == "qmgrd: fatal: unknown parameter: nosuch\n"


def test_bad_config_is_fatal_with_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad value makes postconf exit 1 naming the file, the line and the parameter."""
    (tmp_path / "main.cf").write_text("# x\nsoft_bounce = perhaps\n")
    (tmp_path / "master.cf").write_text(MASTER)
    code, lines, err = run(capsys, "-c", str(tmp_path), "postconf")
    assert code == 1 and lines == []
    assert err.startswith(f"qmgrd: fatal: {tmp_path / 'main.cf'}, line 2: parameter soft_bounce")


def test_warnings_go_to_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Unused parameters are warned about on stderr; -n still prints them."""
    (tmp_path / "main.cf").write_text("mail_nmae = typo\n")
    (tmp_path / "master.cf").write_text(MASTER)
    code, lines, err = run(capsys, "-c", str(tmp_path), "postconf", "-n")
    assert code == 0
    assert lines == ["mail_nmae = typo"]
    assert (
        err == f"qmgrd: warning: {tmp_path / 'main.cf'}, line 1: unused parameter: mail_nmae=typo\n"
    )


def test_postconf_command_streams(confdir: Path) -> None:
    """postconf_command writes to the given streams (the CLI passes stdout and stderr)."""
    out, err = io.StringIO(), io.StringIO()
    code = postconf_command(confdir, PostconfArgs(names=["myhostname"]), out=out, err=err)
    assert (code, out.getvalue(), err.getvalue()) == (0, "myhostname = mx.example\n", "")


def test_repo_config_postconf(capsys: pytest.CaptureFixture[str]) -> None:
    """The checkout's config/ prints its listen address without warnings."""
    config_dir = Path(__file__).resolve().parents[3] / "config"
    code, lines, err = run(capsys, "-c", str(config_dir), "postconf", "smtpd_listen")
    assert (code, lines, err) == (0, ["smtpd_listen = 127.0.0.1:10025"], "")
