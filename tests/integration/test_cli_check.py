"""``qmgrd check`` as a process: the production example passes; each kind of error exits 1.

Every error case asserts the message names the file, the line and the parameter, and that
no traceback reaches the operator. The production configuration (config/production) is
checked with only its spool moved to a temporary directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import trustme

from qmgrd.ops.check import run_checks

REPO = Path(__file__).resolve().parents[2]
PRODUCTION = REPO / "config" / "production"
TIMEOUT = 60


def _config(tmp_path: Path, extra: str = "", master_extra: str = "") -> Path:
    """The production main.cf and master.cf, with a private spool and ``extra`` lines last."""
    cfg = tmp_path / "etc"
    cfg.mkdir()
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o700)
    main = PRODUCTION.joinpath("main.cf").read_text()
    (cfg / "main.cf").write_text(f"{main}myhostname = mx1.example.com\nqueue_directory = {spool}\n"
                                 f"{extra}")
    (cfg / "master.cf").write_text(PRODUCTION.joinpath("master.cf").read_text() + master_extra)
    return cfg


def _line_of(path: Path, text: str) -> int:
    """The 1-based number of the first line of ``path`` that starts with ``text``."""
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.startswith(text):
            return number
    raise AssertionError(f"{text!r} not in {path}")


def _check(cfg: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "qmgrd", "check", "-c", str(cfg)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def test_production_example_passes_and_says_what_would_run(tmp_path: Path) -> None:
    """The shipped production configuration checks clean and the output names what runs."""
    proc = _check(_config(tmp_path, "relayhost = [smtp.example.net]:587\n"))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "listener: SMTP on 127.0.0.1:25; relaying for mynetworks = 127.0.0.0/8 [::1]/128" in out
    assert "transports: smtp (smtp, maxproc 100, TLS may), relay (smtp, maxproc 100, TLS may)" in (
        out
    )
    assert "routing: default_transport = smtp; relayhost = [smtp.example.net]:587" in out
    assert "processes: one; the SMTP listener runs in the queue manager's process" in out
    assert "logs: the journal under systemd" in out and "as qmgrd/<component>" in out
    assert f"spool: {tmp_path / 'spool'} (owner " in out
    assert out.endswith("qmgrd: check passed\n")
    assert "error" not in proc.stderr


def _assert_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("qmgrd: error: ")]
    assert len(errors) == 1, proc.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]
    assert proc.stderr.endswith("qmgrd: check failed: 1 error\n")


def test_refused_postfix_parameter(tmp_path: Path) -> None:
    """A Postfix parameter qmgrd cannot honour: main.cf, its line, the parameter."""
    cfg = _config(tmp_path, "header_checks = regexp:/etc/postfix/header_checks\n")
    line = _line_of(cfg / "main.cf", "header_checks")
    _assert_error(_check(cfg), f"{cfg / 'main.cf'}, line {line}: parameter header_checks")


def test_missing_lookup_table(tmp_path: Path) -> None:
    """transport_maps naming a missing file: main.cf, line, parameter and the file."""
    cfg = _config(tmp_path, "transport_maps = texthash:/nonexistent/transport\n")
    line = _line_of(cfg / "main.cf", "transport_maps")
    _assert_error(
        _check(cfg),
        f"{cfg / 'main.cf'}, line {line}: parameter transport_maps",
        "/nonexistent/transport",
    )


def test_regexp_table_that_does_not_compile(tmp_path: Path) -> None:
    """A bad regexp in a table: the parameter's setting and the table's own file and line."""
    cfg = _config(tmp_path, "transport_maps = regexp:transport.re\n")
    (cfg / "transport.re").write_text("# routes\n/^(unclosed@/ relay:[10.0.0.1]\n")
    line = _line_of(cfg / "main.cf", "transport_maps")
    _assert_error(
        _check(cfg),
        f"{cfg / 'main.cf'}, line {line}: parameter transport_maps",
        f"{cfg / 'transport.re'}, line 2",
    )


def test_unreadable_ca_file(tmp_path: Path) -> None:
    """smtp_tls_CAfile that does not exist: found now, not at the first TLS delivery."""
    cfg = _config(tmp_path, "smtp_tls_CAfile = /nonexistent/ca.pem\n")
    line = _line_of(cfg / "main.cf", "smtp_tls_CAfile")
    _assert_error(_check(cfg), f"{cfg / 'main.cf'}, line {line}: parameter smtp_tls_CAfile")


def test_ca_file_that_is_not_a_certificate_in_a_master_cf_override(tmp_path: Path) -> None:
    """A garbage CA file set with -o in master.cf is reported at that master.cf line."""
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate\n")
    cfg = _config(
        tmp_path,
        master_extra=f"secure    unix  -       -       n       -       -       smtp\n"
        f"  -o smtp_tls_CAfile={bad}\n",
    )
    line = _line_of(cfg / "master.cf", "secure")
    _assert_error(_check(cfg), f"{cfg / 'master.cf'}, line {line}: parameter smtp_tls_CAfile")


def test_good_ca_file_passes(tmp_path: Path) -> None:
    """A real CA certificate (trustme) loads: the check passes."""
    ca = trustme.CA()
    pem = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(pem))
    proc = _check(_config(tmp_path, f"smtp_tls_CAfile = {pem}\n"))
    assert proc.returncode == 0, proc.stderr


def test_missing_sasl_password_file(tmp_path: Path) -> None:
    """SMTP AUTH on with a missing password file: where it is set, and the file."""
    cfg = _config(
        tmp_path,
        "smtpd_sasl_auth_enable = yes\nsmtpd_sasl_password_file = /nonexistent/sasl_passwd\n",
    )
    line = _line_of(cfg / "main.cf", "smtpd_sasl_password_file")
    _assert_error(
        _check(cfg),
        f"{cfg / 'main.cf'}, line {line}: smtpd_sasl_password_file: cannot read "
        "/nonexistent/sasl_passwd",
    )


def test_bad_syslog_name(tmp_path: Path) -> None:
    """A syslog_name log tools cannot parse: main.cf, line, parameter."""
    cfg = _config(tmp_path, "syslog_name = qmgrd/out\n")
    line = _line_of(cfg / "main.cf", "syslog_name = qmgrd/out")
    _assert_error(
        _check(cfg),
        f"{cfg / 'main.cf'}, line {line}: parameter syslog_name: bad value 'qmgrd/out': contains",
    )


def test_maillog_file_in_a_missing_directory(tmp_path: Path) -> None:
    """maillog_file whose directory does not exist: main.cf, line, parameter; nothing created."""
    cfg = _config(tmp_path, f"maillog_file = {tmp_path}/nolog/maillog\n")
    line = _line_of(cfg / "main.cf", "maillog_file =")
    _assert_error(
        _check(cfg), f"{cfg / 'main.cf'}, line {line}: parameter maillog_file: directory"
    )
    assert not (tmp_path / "nolog").exists()


def test_spool_that_is_a_file(tmp_path: Path) -> None:
    """queue_directory naming a regular file: main.cf, line, parameter."""
    cfg = _config(tmp_path, f"queue_directory = {tmp_path}/afile\n")
    (tmp_path / "afile").write_text("")
    line = _line_of(cfg / "main.cf", f"queue_directory = {tmp_path}/afile")
    _assert_error(
        _check(cfg),
        f"{cfg / 'main.cf'}, line {line}: parameter queue_directory: {tmp_path}/afile is not a "
        "directory",
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a queue directory away")
def test_queue_directory_with_another_owner(tmp_path: Path) -> None:
    """A queue directory not owned by the spool's owner (made by root by hand) is an error."""
    cfg = _config(tmp_path)
    deferred = tmp_path / "spool" / "deferred"
    deferred.mkdir(mode=0o700)
    os.chown(deferred, 65534, 65534)
    _assert_error(_check(cfg), "parameter queue_directory", f"{deferred} belongs to ")


def test_spool_owned_by_someone_else(tmp_path: Path) -> None:
    """Checked as a user who does not own the spool: an error naming both users."""
    cfg = _config(tmp_path)
    owner = (tmp_path / "spool").stat().st_uid
    other = 65534 if owner != 65534 else 65533
    found = run_checks(cfg, euid=other)
    (error,) = found.errors
    assert error.startswith(f"{cfg / 'main.cf'}, line ")
    assert "parameter queue_directory" in error and "the daemon must own its spool" in error


def test_several_errors_are_all_reported(tmp_path: Path) -> None:
    """Two independent problems give two error lines and the count."""
    cfg = _config(
        tmp_path,
        f"smtp_tls_CAfile = /nonexistent/ca.pem\nmaillog_file = {tmp_path}/nolog/maillog\n",
    )
    proc = _check(cfg)
    assert proc.returncode == 1
    assert proc.stderr.count("qmgrd: error: ") == 2
    assert proc.stderr.endswith("qmgrd: check failed: 2 errors\n")


@pytest.mark.parametrize(
    ("value", "fact"),
    [
        ("3", "processes: 3 SMTP listener processes (qmgrd-smtpd) and the queue manager"),
        ("1", "processes: one; the SMTP listener runs in the queue manager's process"),
    ],
)
def test_check_names_the_listener_processes(tmp_path: Path, value: str, fact: str) -> None:
    """smtpd_worker_processes: how many processes would run."""
    proc = _check(_config(tmp_path, f"smtpd_worker_processes = {value}\n"))
    assert proc.returncode == 0, proc.stderr
    assert fact in proc.stdout


def test_check_names_the_delivery_processes(tmp_path: Path) -> None:
    """delivery_worker_processes: how many delivery processes would run (none by default)."""
    proc = _check(_config(tmp_path, "delivery_worker_processes = 2\n"))
    assert proc.returncode == 0, proc.stderr
    assert "processes: 2 SMTP delivery processes (qmgrd-delivery)" in proc.stdout
    (tmp_path / "default").mkdir()
    assert "qmgrd-delivery" not in _check(_config(tmp_path / "default")).stdout


def test_check_refuses_a_bad_worker_count(tmp_path: Path) -> None:
    """smtpd_worker_processes must be auto or a number: one error naming it."""
    proc = _check(_config(tmp_path, "smtpd_worker_processes = many\n"))
    _assert_error(proc, "smtpd_worker_processes")
