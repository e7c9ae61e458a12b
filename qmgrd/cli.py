"""The ``qmgrd`` command line: the only place that exits the process.

Each subcommand lives in the module that owns its subject; this file parses
arguments, loads the configuration, and maps operator errors to exit codes:
0 success, 1 operator error (bad config, unusable spool, daemon not running),
2 usage error. Never a traceback for an error the operator can fix.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from qmgrd.errors import QmgrdError

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2

DEFAULT_CONFIG_DIR = "/etc/qmgrd"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; subcommand modules add nothing global."""
    parser = argparse.ArgumentParser(
        prog="qmgrd", description="Mail delivery daemon with a Postfix-style queue manager."
    )
    parser.add_argument(
        "-c",
        dest="config_dir",
        default=None,
        help=f"configuration directory with main.cf and master.cf (default {DEFAULT_CONFIG_DIR})",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    sub.add_parser("run", help="run the daemon in the foreground (what systemd starts)")

    p = sub.add_parser("postconf", help="print configuration parameters")
    g = p.add_mutually_exclusive_group()
    g.add_argument("-d", dest="defaults", action="store_true", help="print default values")
    g.add_argument("-n", dest="nondefault", action="store_true", help="only those set in main.cf")
    p.add_argument("names", nargs="*", help="parameter names (default: all)")

    p = sub.add_parser("mailq", help="list the queue in Postfix mailq format")
    p.add_argument("--json", action="store_true", help="one JSON object per message")
    return parser


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
        return _dispatch(args)
    except QmgrdError as exc:
        print(f"qmgrd: fatal: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_ERROR


def _dispatch(args: argparse.Namespace) -> int:
    config_dir = _config_dir(args)
    if args.command == "postconf":
        from qmgrd.config.postconf import postconf_command

        return postconf_command(
            config_dir,
            defaults=args.defaults,
            nondefault=args.nondefault,
            names=args.names,
            out=sys.stdout,
            err=sys.stderr,
        )
    if args.command == "run":
        from qmgrd.daemon.run import run_command

        return run_command(config_dir)
    if args.command == "mailq":
        from qmgrd.spool.mailq import mailq_command

        return mailq_command(config_dir, as_json=args.json, out=sys.stdout)
    raise AssertionError(f"unhandled command {args.command}")  # argparse restricts choices
