"""daskcfa's loggers: one per module, named ``daskcfa.<module>``.

The library configures no handler but a :class:`logging.NullHandler` on the
``daskcfa`` logger, as libraries should: an application shows the records
with ``logging.basicConfig(level=...)`` or a handler of its own. What is
logged: fragment opens and engine choices or fallbacks at DEBUG, storage
retries and fragments read as missing data at WARNING, leases taken over at
WARNING, commits of aggregation files at INFO. URIs go through
:func:`daskcfa.errors.redact`, and every record of a process holding
credentials passes :mod:`daskcfa.storage.redaction` too.
"""

from __future__ import annotations

import logging

__all__ = ["logger"]

logging.getLogger("daskcfa").addHandler(logging.NullHandler())


def logger(name: str) -> logging.Logger:
    """The logger of module ``name`` (pass ``__name__``), under daskcfa's NullHandler."""
    return logging.getLogger(name)
