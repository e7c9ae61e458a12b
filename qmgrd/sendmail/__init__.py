"""The ``sendmail`` command (Postfix's sendmail(1) + postdrop) and the maildrop format.

- `maildrop`: the file format written here and read, untrusted, by the pickup;
- `options`: sendmail's command line, Postfix's options and their meaning;
- `command`: ``main(argv)`` for the ``sendmail`` / ``mailq`` console scripts
  and ``qmgrd sendmail``; exit codes from sysexits.h;
- `smtp`: ``sendmail -bs``, SMTP on standard input and output.
"""
