"""Helpers shared by the tests that no secret leaks (storage/test_policy.py,
reliability/test_secrets.py): log records captured in this process and on
workers, and storage options new to the registry."""

from __future__ import annotations

import logging

LOGGERS = ("distributed", "daskcfa", "fsspec", "s3fs", "botocore", "aiobotocore", "urllib3", "aiohttp", "asyncio")

_counter = iter(range(10**6))


def _unique_options(server):
    """The server's options plus a harmless unique setting, so that they are new to the registry."""
    return dict(server.storage_options, config_kwargs={"read_timeout": 60 + next(_counter) + 0.5})


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))

    def emit(self, record):
        try:
            self.lines.append(self.format(record))
        except Exception as exc:  # a record that cannot be formatted is kept raw
            self.lines.append(f"{record.name} {record.msg!r} {record.args!r} ({exc})")


def _start_capture(names=LOGGERS):
    handler = _Capture()
    saved = []
    for name in names:
        logger = logging.getLogger(name)
        saved.append((logger, logger.level))
        logger.setLevel(logging.DEBUG)
        logger.addHandler(handler)
    return handler, saved


def _stop_capture(handler, saved):
    for logger, level in saved:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return handler.lines


def _worker_start_capture(dask_worker=None):
    handler, _ = _start_capture(LOGGERS)
    if dask_worker is not None:
        dask_worker._daskcfa_test_capture = handler
    return True


def _worker_lines(dask_worker=None):
    handler = getattr(dask_worker, "_daskcfa_test_capture", None)
    return list(handler.lines) if handler is not None else []
