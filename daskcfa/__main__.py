"""``python -m daskcfa``: the ``daskcfa`` command line."""

from .cli import main

raise SystemExit(main())
