"""``python -m qmgrd.sendmail``: the sendmail command (as the console script)."""

from qmgrd.sendmail.command import console_main

console_main()
