"""``sendmail``, ``mailq``, ``newaliases`` and ``qmgrd sendmail``: submission into maildrop/.

``main(argv, program=...)`` returns a sysexits.h code and never raises for a
usage, configuration or environment error (one line on stderr, as Postfix's
``sendmail: fatal: ...``):

- 0 EX_OK; 64 EX_USAGE (bad option, no recipients); 65 EX_DATAERR (message
  larger than ``message_size_limit``, bad address); 66 EX_NOINPUT (standard
  input unreadable); 69 EX_UNAVAILABLE (``-q`` with the daemon stopped, an
  unsupported mode); 70 EX_SOFTWARE (a bug); 75 EX_TEMPFAIL (the maildrop
  directory cannot be written: try again later); 78 EX_CONFIG (main.cf).

Mail mode (default ``-bm``): the message is read from standard input (a line
with a single ``.`` ends it unless ``-i``/``-oi``; a leading ``From `` line
is dropped), recipients come from the arguments (comma-separated lists and
``Name <addr>`` forms accepted) and, with ``-t``, from To:, Cc: and Bcc:
(Resent-To/Cc/Bcc when Resent- headers exist); the file is written into the
maildrop directory durably and the daemon's pickup is poked. The daemon need
not run: the file waits.
"""

from __future__ import annotations

import email.utils
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO, TextIO

from qmgrd.errors import QmgrdError
from qmgrd.sendmail.maildrop import (
    MaildropError,
    MaildropMessage,
    encode_maildrop,
    wake_pickup,
    write_maildrop,
)
from qmgrd.sendmail.options import Options, UsageError, parse

EX_OK = 0
EX_USAGE = 64
EX_DATAERR = 65
EX_NOINPUT = 66
EX_UNAVAILABLE = 69
EX_SOFTWARE = 70
EX_TEMPFAIL = 75
EX_CONFIG = 78

DEFAULT_CONFIG_DIR = "/etc/qmgrd"
HEADER_SCAN_LIMIT = 1024 * 1024  # -t: recipients are taken from the first MB of headers


class Fatal(Exception):
    """An error ending the command with an exit code."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code = code


def main(
    argv: Sequence[str] | None = None,
    *,
    program: str | None = None,
    config_dir: str | None = None,
    stdin: BinaryIO | None = None,
    stdout: BinaryIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Run sendmail with ``argv`` (without the program name); the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    name = program or os.path.basename(sys.argv[0] if argv is None else "sendmail")
    err = err or sys.stderr
    try:
        opts = parse(args, program=name)
        return _run(
            opts,
            config_dir or opts.config_dir or os.environ.get("MAIL_CONFIG") or DEFAULT_CONFIG_DIR,
            stdin or sys.stdin.buffer,
            stdout or sys.stdout.buffer,
            err,
        )
    except UsageError as exc:
        err.write(f"sendmail: fatal: {exc}\n")
        err.write("usage: sendmail [-t] [-i] [-f sender] [-F name] [-bs|-bp|-bv|-q] [rcpt ...]\n")
        return EX_USAGE
    except Fatal as exc:
        err.write(f"sendmail: fatal: {exc}\n")
        return exc.code
    except KeyboardInterrupt:
        return EX_TEMPFAIL


def console_main() -> None:
    """The ``sendmail`` / ``mailq`` console scripts."""
    raise SystemExit(main())


def _config(config_dir: str) -> tuple[object, Path, int]:
    from qmgrd.config import load_config

    try:
        cfg = load_config(Path(config_dir), strict=False)
        maildrop = cfg.get_path("maildrop_directory")
        limit = cfg.get_int("message_size_limit")
    except QmgrdError as exc:
        raise Fatal(EX_CONFIG, str(exc)) from None
    return cfg, maildrop, limit


def _run(opts: Options, config_dir: str, stdin: BinaryIO, stdout: BinaryIO, err: TextIO) -> int:
    if opts.mode == "p":
        return _mailq(config_dir, err)
    if opts.mode == "q":
        return _flush(config_dir, opts, err)
    if opts.mode == "i":
        err.write("sendmail: qmgrd has no aliases database (no local delivery); nothing to do\n")
        return EX_OK
    if opts.mode in ("d", "h", "H", "l"):
        raise Fatal(EX_UNAVAILABLE, f"unsupported: -b{opts.mode} (start the daemon: qmgrd run)")
    cfg, maildrop, limit = _config(config_dir)
    if opts.mode == "v":
        return _verify(cfg, opts, stdout)
    if opts.mode == "s":
        from qmgrd.config.config import Config
        from qmgrd.sendmail.smtp import serve

        assert isinstance(cfg, Config)
        return serve(
            stdin,
            stdout,
            maildrop=maildrop,
            size_limit=limit,
            opts=opts,
            host=cfg.get_str("myhostname"),
        )
    return _submit(opts, stdin, maildrop, limit, err)


def _submit(opts: Options, stdin: BinaryIO, maildrop: Path, limit: int, err: TextIO) -> int:
    recipients = _address_list(opts.recipients)
    if not opts.extract and not recipients:
        raise Fatal(
            EX_USAGE,
            "Recipient addresses must be specified on the command line or via the -t option",
        )
    content = read_message(stdin, ignore_dots=opts.ignore_dots, limit=limit)
    if opts.extract:
        recipients.extend(extract_recipients(content))
        if not recipients:
            raise Fatal(EX_USAGE, "No recipient addresses found in message header")
    sender = _sender(opts.sender)
    queue_id = submit(
        maildrop,
        MaildropMessage(
            sender=sender if sender is not None else _login_name(),
            recipients=tuple(recipients),
            content=content,
            full_name=opts.full_name,
            notify=opts.notify,
            ret=opts.ret,
            envid=opts.envid,
        ),
    )
    running = wake_pickup(maildrop)
    if opts.verbose:
        state = "picked up now" if running else "waiting in maildrop (daemon not running)"
        err.write(f"sendmail: queued as {queue_id}, {state}\n")
    return EX_OK


def submit(maildrop: Path, message: MaildropMessage) -> str:
    """Write one maildrop file; its name (a queue id). Fatal with EX_TEMPFAIL/EX_DATAERR."""
    from qmgrd.spool import new_queue_id

    try:
        data = encode_maildrop(message)
    except MaildropError as exc:
        raise Fatal(EX_DATAERR, str(exc)) from None
    queue_id = new_queue_id()
    try:
        write_maildrop(maildrop, queue_id, data)
    except OSError as exc:
        raise Fatal(
            EX_TEMPFAIL,
            f"cannot write to the maildrop directory {maildrop}: {exc.strerror or exc} "
            "(is this user allowed to submit mail? see README 'sendmail')",
        ) from None
    return queue_id


def read_message(stdin: BinaryIO, *, ignore_dots: bool, limit: int) -> bytes:
    """The message from standard input (module doc); Fatal when it exceeds ``limit``."""
    parts: list[bytes] = []
    total = 0
    first = True
    try:
        while True:
            line = stdin.readline(65536)
            if not line:
                break
            if first:
                first = False
                if line.startswith(b"From "):
                    continue
            if not ignore_dots and line.rstrip(b"\r\n") == b"." and line.endswith(b"\n"):
                break
            total += len(line)
            if total > limit:
                raise Fatal(EX_DATAERR, f"message file too big (message_size_limit {limit})")
            parts.append(line)
    except OSError as exc:
        raise Fatal(EX_NOINPUT, f"cannot read standard input: {exc.strerror or exc}") from None
    return b"".join(parts)


def extract_recipients(content: bytes) -> list[str]:
    """-t: the addresses of To:, Cc:, Bcc: (Resent-* if present) in the header section."""
    head = content[:HEADER_SCAN_LIMIT]
    for sep in (b"\r\n\r\n", b"\n\n"):
        cut = head.find(sep)
        if cut >= 0:
            head = head[:cut]
            break
    text = head.decode("utf-8", "replace").replace("\r\n", "\n")
    headers: list[tuple[str, str]] = []
    for line in text.split("\n"):
        if line[:1] in (" ", "\t") and headers:
            name, value = headers[-1]
            headers[-1] = (name, value + " " + line.strip())
        elif ":" in line:
            name, _, value = line.partition(":")
            headers.append((name.strip().lower(), value.strip()))
    resent = any(n.startswith("resent-") for n, _ in headers)
    wanted = {"resent-to", "resent-cc", "resent-bcc"} if resent else {"to", "cc", "bcc"}
    values = [v for n, v in headers if n in wanted]
    return [a for _, a in email.utils.getaddresses(values) if a and ("@" in a or _bare(a))]


def _bare(address: str) -> bool:
    return bool(address) and " " not in address and ":" not in address


def _address_list(words: Sequence[str]) -> list[str]:
    found: list[str] = []
    for _, address in email.utils.getaddresses(list(words)):
        if address:
            found.append(address)
    return found


def _sender(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip()
    if value in ("<>", ""):
        return ""
    if value.startswith("<") and value.endswith(">"):
        return value[1:-1]
    return value


def _login_name() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return f"uid{os.getuid()}"


def _mailq(config_dir: str, err: TextIO) -> int:
    from qmgrd.spool.mailq import mailq_command

    try:
        return mailq_command(Path(config_dir), as_json=False, out=sys.stdout)
    except QmgrdError as exc:
        raise Fatal(EX_UNAVAILABLE, str(exc)) from None


def _flush(config_dir: str, opts: Options, err: TextIO) -> int:
    if not opts.flush:
        return EX_OK  # -q<interval>: a daemon option, ignored as Postfix does
    from qmgrd.config import load_config
    from qmgrd.ops.status import flush_command

    try:
        queue_directory = load_config(Path(config_dir), strict=False).get_path("queue_directory")
        return flush_command(
            queue_directory, destination=opts.flush_site, queue_id=None, out=sys.stdout, err=err
        )
    except QmgrdError as exc:
        raise Fatal(EX_UNAVAILABLE, f"Cannot flush mail queue - {exc}") from None


def _verify(cfg: object, opts: Options, stdout: BinaryIO) -> int:
    from qmgrd.cleanup import CleanupSettings, rewrite_recipient
    from qmgrd.config.config import Config
    from qmgrd.listener.address import AddressError, check_mailbox

    assert isinstance(cfg, Config)
    recipients = _address_list(opts.recipients)
    if not recipients:
        raise Fatal(EX_USAGE, "Recipient addresses must be specified on the command line")
    try:
        settings = CleanupSettings.from_config(cfg)
    except QmgrdError as exc:
        raise Fatal(EX_CONFIG, str(exc)) from None
    code = EX_OK
    for raw in recipients:
        address = rewrite_recipient(settings, raw)
        try:
            check_mailbox(address)
            line = f"<{raw}>: deliverable as <{address}> (accepted for relaying)\n"
        except AddressError as exc:
            line = f"<{raw}>: undeliverable: {exc}\n"
            code = EX_DATAERR
        stdout.write(line.encode("utf-8", "replace"))
    stdout.flush()
    return code
