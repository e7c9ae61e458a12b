"""The ``qmgrd`` command line: the only place that exits the process.

Each subcommand lives in the module that owns its subject; this file parses
arguments, loads the configuration, and maps operator errors to exit codes:
0 success, 1 operator error (bad config, unusable spool, daemon not running),
2 usage error. Never a traceback for an error the operator can fix.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from qmgrd.errors import QmgrdError

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 141  # what a shell reports for a command killed by SIGPIPE

VERSION = "0.1.0"

DEFAULT_CONFIG_DIR = "/etc/qmgrd"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; subcommand modules add nothing global."""
    parser = argparse.ArgumentParser(
        prog="qmgrd", description="Mail delivery daemon with a Postfix-style queue manager."
    )
    parser.add_argument("--version", action="version", version=f"qmgrd {VERSION}")
    _add_config_option(parser, default=None)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    sub.add_parser("run", help="run the daemon in the foreground (what systemd starts)")
    sub.add_parser(
        "check",
        help="load the configuration, tables, certificates and spool; say what would run",
        description="Load everything 'qmgrd run' would (strict configuration, lookup tables, "
        "TLS CA files, the SASL password file, log and metrics settings) and look at the "
        "spool's existence, mode and owner. Prints what would run; exits 1 naming file, line "
        "and parameter of each problem. Binds nothing and changes nothing.",
    )

    p = sub.add_parser(
        "postconf",
        help="print or edit configuration parameters (postconf)",
        add_help=False,
        description="Print parameters as name = value (default: all, as written or default).",
    )
    p.add_argument("--help", action="help", help="show this help message and exit")
    g = p.add_mutually_exclusive_group()
    g.add_argument("-d", dest="defaults", action="store_true", help="print default values")
    g.add_argument("-n", dest="nondefault", action="store_true", help="only those set in main.cf")
    g.add_argument(
        "-e",
        dest="edit",
        action="store_true",
        help="edit main.cf: set each name=value (validated first, written atomically)",
    )
    g.add_argument(
        "-#",
        dest="comment",
        action="store_true",
        help="edit main.cf: comment out the named parameters",
    )
    g.add_argument(
        "-M",
        dest="master",
        action="store_true",
        help="print master.cf entries (optionally only service or service/type)",
    )
    p.add_argument("-x", dest="expand", action="store_true", help="expand $name in values")
    p.add_argument(
        "-h", dest="value_only", action="store_true", help="print values only, without 'name ='"
    )
    p.add_argument("names", nargs="*", help="parameter names, or name=value with -e")

    p = sub.add_parser(
        "cat",
        help="show one queued message: envelope, header, body (postcat -q)",
        add_help=False,
        description="Show the message ID from the queue; -e, -h and -b select sections. "
        "Non-printable characters are escaped.",
    )
    p.add_argument("--help", action="help", help="show this help message and exit")
    p.add_argument("-e", dest="envelope", action="store_true", help="the envelope")
    p.add_argument("-h", dest="header", action="store_true", help="the message header")
    p.add_argument("-b", dest="body", action="store_true", help="the message body")
    p.add_argument(
        "-q",
        dest="queue_flag",
        action="store_true",
        help="accepted for postcat compatibility (ID is always a queue id)",
    )
    p.add_argument("queue_id", metavar="ID")

    p = sub.add_parser(
        "postmap",
        help="build FILE.qmgrd.db for hash:/lmdb: tables, or query a table (postmap)",
    )
    p.add_argument("-q", dest="query", metavar="KEY", help="print the value of KEY in the table")
    p.add_argument("tables", nargs="+", metavar="[TYPE:]FILE")

    p = sub.add_parser(
        "sendmail",
        help="submit mail as sendmail(1) does (-t, -i, -f, -bs, -bp, -q, ...; see README)",
        add_help=False,
        prefix_chars="+",  # every word after "sendmail" is sendmail's, options included
    )
    p.add_argument("args", nargs=argparse.REMAINDER)

    p = sub.add_parser("mailq", help="list the queue in Postfix mailq format")
    p.add_argument("--json", action="store_true", help="one JSON object per message")

    p = sub.add_parser(
        "qshape",
        help="queue shape: messages by domain and age (Postfix qshape)",
        description="Recipients (or, with --by sender, messages) per domain and age bucket; "
        "ages are minutes since arrival. Reads the spool; no daemon needed.",
    )
    p.add_argument(
        "queues",
        nargs="*",
        metavar="QUEUE",
        help="incoming, active, deferred or hold (default: incoming active)",
    )
    p.add_argument(
        "--by",
        choices=("recipient", "sender"),
        default="recipient",
        help="group by recipient domain (default) or sender domain",
    )
    p.add_argument(
        "-s", dest="by", action="store_const", const="sender", help="same as --by sender"
    )
    p.add_argument("-t", dest="bucket_minutes", type=int, default=5, metavar="MINUTES",
                   help="age limit of the first bucket (default 5)")
    p.add_argument("-b", dest="buckets", type=int, default=10, metavar="COUNT",
                   help="number of age buckets, each twice the previous (default 10)")

    p = sub.add_parser(
        "flush",
        help="retry deferred mail now (postqueue -f / -s / -i); needs the daemon",
        description="Without options: forget dead destinations and retry every deferred "
        "message now. Needs the running daemon.",
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument("-s", dest="destination", metavar="DOMAIN",
                   help="only deferred mail with a recipient in DOMAIN")
    g.add_argument("-i", dest="queue_id", metavar="ID", help="only the deferred message ID")

    sub.add_parser("scan", help="make the daemon look at the incoming queue now")

    p = sub.add_parser("status", help="the running daemon's queues, transports and destinations")
    p.add_argument("--json", action="store_true", help="the control socket's JSON reply")

    for op, text in (
        ("hold", "put messages on hold (no delivery until released)"),
        ("release", "release held messages (deliver them now)"),
        ("delete", "delete messages and their logs"),
        ("requeue", "requeue messages: resolve their recipients again with the current config"),
        ("expire", "force messages to expire: return them to the sender now (postsuper -e)"),
    ):
        p = sub.add_parser(
            op,
            help=text,
            description=f"{text[0].upper()}{text[1:]}. Safe while the daemon runs: it then "
            "does the work itself (a message being delivered is handled when that delivery "
            "ends); otherwise the spool is changed directly, like postsuper.",
        )
        p.add_argument(
            "ids",
            nargs="+",
            metavar="ID",
            help="queue ids, ALL for every message, or - to read ids from standard input",
        )
    sub.choices["expire"].add_argument(
        "-f",
        dest="release",
        action="store_true",
        help="also release expired messages from hold, so they are returned now (postsuper -f)",
    )
    p = sub.add_parser(
        "saslpasswd",
        help="print a USER:HASH line for smtpd_sasl_password_file (asks for the password)",
    )
    p.add_argument("user")
    p.add_argument("--scheme", choices=("pbkdf2-sha256", "scrypt"), default="pbkdf2-sha256")
    p.add_argument("--stdin", action="store_true", help="read the password from standard input")
    for name, subparser in sub.choices.items():
        if name != "sendmail":  # sendmail's words are its own (-C DIR names the config there)
            _add_config_option(subparser, default=argparse.SUPPRESS)
    return parser


def _add_config_option(parser: argparse.ArgumentParser, *, default: object) -> None:
    """-c DIR, before or after the subcommand (SUPPRESS keeps a subcommand from resetting it)."""
    parser.add_argument(
        "-c",
        dest="config_dir",
        default=default,
        metavar="DIR",
        help=f"configuration directory with main.cf and master.cf (default {DEFAULT_CONFIG_DIR})",
    )


def _config_dir(args: argparse.Namespace) -> Path:
    return Path(args.config_dir or DEFAULT_CONFIG_DIR)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 on --help
        return int(exc.code or 0)
    try:
        code = _dispatch(args)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except QmgrdError as exc:
        print(f"qmgrd: fatal: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_ERROR
    except BrokenPipeError:
        # The reader went away (``qmgrd postconf | head -1``): stop quietly, as Postfix's
        # tools die of SIGPIPE. Point stdout at /dev/null so the final flush cannot fail.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE


def _dispatch(args: argparse.Namespace) -> int:
    config_dir = _config_dir(args)
    if args.command == "postconf":
        from qmgrd.config.postconf import PostconfArgs, postconf_command

        flags = PostconfArgs(
            names=args.names,
            defaults=args.defaults,
            nondefault=args.nondefault,
            expand=args.expand,
            value_only=args.value_only,
            edit=args.edit,
            comment=args.comment,
            master=args.master,
        )
        return postconf_command(config_dir, flags, out=sys.stdout, err=sys.stderr)
    if args.command == "postmap":
        from qmgrd.ops.postmap import postmap_command

        return postmap_command(args.tables, query=args.query, out=sys.stdout, err=sys.stderr)
    if args.command == "sendmail":
        from qmgrd.sendmail.command import main as sendmail_main

        # sendmail's own exit codes (sysexits.h), not qmgrd's
        return sendmail_main(args.args, program="sendmail", config_dir=str(config_dir))
    if args.command == "run":
        from qmgrd.daemon.run import run_command

        return run_command(config_dir)
    if args.command == "check":
        from qmgrd.ops.check import check_command

        return check_command(config_dir, out=sys.stdout, err=sys.stderr)
    if args.command == "mailq":
        from qmgrd.spool.mailq import mailq_command

        queue_directory = _queue_directory(config_dir)
        if not queue_directory.is_dir():  # not "Mail queue is empty": nothing was looked at
            print(
                f"qmgrd: fatal: queue directory {queue_directory} does not exist", file=sys.stderr
            )
            return EXIT_ERROR
        return mailq_command(config_dir, as_json=args.json, out=sys.stdout)
    if args.command == "cat":
        from qmgrd.ops.postcat import cat_command

        return cat_command(
            _queue_directory(config_dir),
            args.queue_id,
            envelope=args.envelope,
            header=args.header,
            body=args.body,
            out=sys.stdout,
            err=sys.stderr,
        )
    return _dispatch_ops(args, config_dir)


def _queue_directory(config_dir: Path) -> Path:
    """The spool of the configuration; the operator tools work even when the daemon would
    refuse the configuration (a Postfix parameter qmgrd cannot honour), to inspect the queue."""
    from qmgrd.config import load_config

    return load_config(config_dir, strict=False).get_path("queue_directory")


def _dispatch_ops(args: argparse.Namespace, config_dir: Path) -> int:
    """The operator commands (qmgrd.ops): qshape, flush, scan, status, postsuper's five."""
    if args.command == "qshape":
        from qmgrd.ops.qshape import SHAPE_QUEUES, qshape_command

        unknown = [q for q in args.queues if q not in SHAPE_QUEUES]
        if unknown:
            print(
                f"qmgrd: fatal: unknown queue {unknown[0]!r} "
                f"(expected: {' '.join(SHAPE_QUEUES)})",
                file=sys.stderr,
            )
            return EXIT_USAGE
        if args.bucket_minutes < 1 or args.buckets < 2:
            print("qmgrd: fatal: need -t >= 1 and -b >= 2", file=sys.stderr)
            return EXIT_USAGE
        return qshape_command(
            _queue_directory(config_dir),
            args.queues,
            by_sender=args.by == "sender",
            out=sys.stdout,
            now=time.time(),
            bucket_minutes=args.bucket_minutes,
            buckets=args.buckets,
        )
    if args.command in ("flush", "scan", "status"):
        from qmgrd.ops.status import flush_command, scan_command, status_command

        queue_directory = _queue_directory(config_dir)
        if args.command == "flush":
            return flush_command(
                queue_directory,
                destination=args.destination,
                queue_id=args.queue_id,
                out=sys.stdout,
                err=sys.stderr,
            )
        if args.command == "scan":
            return scan_command(queue_directory)
        return status_command(queue_directory, as_json=args.json, out=sys.stdout)
    if args.command == "saslpasswd":
        from qmgrd.listener.auth import main as auth_main

        argv = ["hash", args.user, "--scheme", args.scheme] + (["--stdin"] if args.stdin else [])
        return auth_main(argv)
    if args.command in ("hold", "release", "delete", "requeue", "expire"):
        from qmgrd.ops.postsuper import operate_command

        return operate_command(
            _queue_directory(config_dir),
            args.command,
            args.ids,
            stdin=sys.stdin,
            out=sys.stdout,
            err=sys.stderr,
            now=time.time(),
            release=getattr(args, "release", False),
        )
    raise AssertionError(f"unhandled command {args.command}")  # argparse restricts choices
