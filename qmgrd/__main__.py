"""Allow ``python -m qmgrd``."""

from qmgrd.cli import main

raise SystemExit(main())
