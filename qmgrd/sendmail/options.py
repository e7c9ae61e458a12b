"""sendmail's command line as Postfix parses it (sendmail.c's getopt string).

`parse(argv)` returns `Options` or raises `UsageError` (EX_USAGE). Options
with an argument (attached or as the next word): ``-B -C -F -L -N -O -R -V
-X -b -e -f -h -o -p -r``; ``-q`` takes an optional attached argument;
flags: ``-G -I -U -c -i -m -n -t -v -x``. Option parsing stops at the first
word that is not an option, or after ``--``. What each does (Postfix's
meaning, or "accepted and ignored" as Postfix ignores it) is in `Options`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

WITH_ARG = frozenset("BCFLNORVXbefhopr")
FLAGS = frozenset("GIUcimntvx")
MODES = frozenset("dhHilmpsv")


class UsageError(Exception):
    """A command line sendmail does not accept (EX_USAGE)."""


@dataclass(slots=True)
class Options:
    """The parsed command line."""

    mode: str = "m"  # -b: m (mail, default), s (SMTP), p (mailq), v (verify), i (newaliases)
    extract: bool = False  # -t
    ignore_dots: bool = False  # -i, -oi
    sender: str | None = None  # -f / -r
    full_name: str = ""  # -F
    notify: frozenset[str] = frozenset()  # -N
    ret: str | None = None  # -R full|hdrs
    envid: str | None = None  # -V
    verbose: int = 0  # -v
    config_dir: str | None = None  # -C
    flush: bool = False  # -q without an interval
    flush_site: str | None = None  # -qR site / -qS site
    recipients: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  # for -v


def parse(argv: list[str], *, program: str = "sendmail") -> Options:
    """Parse sendmail's arguments (not including the program name)."""
    opts = Options()
    if program == "mailq":
        opts.mode = "p"
    elif program == "newaliases":
        opts.mode = "i"
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            i += 1
            break
        if not word.startswith("-") or word == "-":
            break
        j = 1
        while j < len(word):
            letter = word[j]
            if letter == "q":
                _queue_run(opts, word[j + 1 :])
                break
            if letter in FLAGS:
                _flag(opts, letter)
                j += 1
                continue
            if letter in WITH_ARG:
                value = word[j + 1 :]
                if not value:
                    i += 1
                    if i >= len(argv):
                        raise UsageError(f"option requires an argument -- '{letter}'")
                    value = argv[i]
                _with_arg(opts, letter, value)
                break
            raise UsageError(f"invalid option -- '{letter}'")
        i += 1
    opts.recipients = argv[i:]
    return opts


def _flag(opts: Options, letter: str) -> None:
    if letter == "t":
        opts.extract = True
    elif letter == "i":
        opts.ignore_dots = True
    elif letter == "v":
        opts.verbose += 1
    elif letter == "I":
        opts.mode = "i"
    else:  # -G -U -c -m -n -x: accepted and ignored, as Postfix does
        opts.ignored.append("-" + letter)


def _with_arg(opts: Options, letter: str, value: str) -> None:
    if letter in ("f", "r"):
        opts.sender = value
    elif letter == "F":
        opts.full_name = value
    elif letter == "C":
        opts.config_dir = value
    elif letter == "b":
        if len(value) != 1 or value not in MODES:
            raise UsageError(f"unsupported: -b{value}")
        opts.mode = value
    elif letter == "o":
        if value == "i":
            opts.ignore_dots = True
        else:
            opts.ignored.append("-o" + value)
    elif letter == "N":
        words = {w.strip().upper() for w in value.split(",") if w.strip()}
        if not words <= {"NEVER", "SUCCESS", "FAILURE", "DELAY"} or (
            "NEVER" in words and len(words) > 1
        ):
            raise UsageError(f"bad -N value: {value}")
        opts.notify = frozenset(words)
    elif letter == "R":
        if value.upper() not in ("FULL", "HDRS"):
            raise UsageError(f"bad -R value: {value} (expected full or hdrs)")
        opts.ret = value.upper()
    elif letter == "V":
        opts.envid = value
    else:  # -B -L -O -X -e -h -p: accepted and ignored
        opts.ignored.append(f"-{letter} {value}")


def _queue_run(opts: Options, rest: str) -> None:
    if not rest:
        opts.flush = True
    elif rest[0] in "RS":
        site = rest[1:]
        if not site:
            raise UsageError(f"-q{rest[0]} needs a site")
        opts.flush = True
        opts.flush_site = site
    else:
        opts.ignored.append("-q" + rest)  # -q<interval>: a daemon option, ignored (Postfix)
    if opts.mode == "m":
        opts.mode = "q"
