"""qmgrd: a mail delivery daemon with a Postfix-style queue manager."""

__version__ = "0.1.0"
