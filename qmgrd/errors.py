"""The three kinds of failure (STYLE §6).

A broken invariant is a bug (`InvariantError`). A broken environment or bad
configuration is an operator error (`SpoolError`, `ConfigError`): the CLI maps
it to an exit code and a one-line message. Remote failures are never
exceptions: they are delivery results carrying a DSN code.
"""


class QmgrdError(Exception):
    """Base class of every error qmgrd raises on purpose."""


class ConfigError(QmgrdError):
    """Bad configuration: the message names the file, the line and the parameter."""


class SpoolError(QmgrdError):
    """The spool cannot be used (missing, unwritable, full, or a file cannot be parsed)."""


class InvariantError(QmgrdError):
    """A scheduler or spool invariant is broken: a bug in qmgrd, never an operator error."""
