"""What a ``distributed`` worker process needs before it reads fragments: set up once, on its first read.

distributed's nanny starts workers with ``MALLOC_TRIM_THRESHOLD_=65536`` (config
``distributed.nanny.pre-spawn-environ``), so that freed memory goes back to the operating system.
Setting that also turns off glibc's sliding mmap threshold: every allocation of 128 KiB or more --
each decoded chunk, each fragment's values -- is then a fresh ``mmap`` whose pages the kernel faults
in and zeroes, unmapped again when freed. The zlib mean of 1 GB in 100 fragments took two such workers
553,000-580,000 page faults and 1.3-2.0 s of system CPU; with glibc's defaults or the setting below,
600-1,200 faults and 0.2-0.4 s
(docs/performance.md).

So on a worker started so, the first read raises the mmap threshold to 32 MiB (the most glibc's own
sliding threshold reaches) and lets each malloc arena keep up to ``daskcfa.io.worker-malloc-keep``
bytes (default 32 MiB) of freed memory for the next allocations (``M_TOP_PAD``): what is freed beyond
that still goes back to the system, as the nanny wants. 0 leaves malloc as the worker started.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
import threading

from .. import storage
from ..logs import logger

__all__ = ["on_distributed_worker", "prepare"]

log = logger(__name__)

#: glibc's ``mallopt`` parameters (malloc.h)
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
#: glibc's largest sliding mmap threshold on 64-bit systems (``DEFAULT_MMAP_THRESHOLD_MAX``)
_MMAP_THRESHOLD = 32 << 20
#: Freed memory a malloc arena keeps by default (``daskcfa.io.worker-malloc-keep``)
DEFAULT_KEEP = 32 << 20

_lock = threading.Lock()
_prepared = False


def on_distributed_worker() -> bool:
    """Whether this thread runs a task of a ``distributed`` worker."""
    worker = sys.modules.get("distributed.worker")  # (not imported: not a worker)
    if worker is None:
        return False
    try:
        worker.get_worker()
    except ValueError:
        return False
    return True


def prepare() -> None:
    """Before a read: on the first one in a ``distributed`` worker, set the process up (see the module)."""
    global _prepared
    if _prepared or not on_distributed_worker():  # (the flag first: every read asks)
        return
    with _lock:
        if not _prepared:
            _keep_freed_memory()
            _prepared = True


def _keep_freed_memory() -> None:
    keep = storage.config_bytes("daskcfa.io.worker-malloc-keep", DEFAULT_KEEP)
    if keep <= 0 or "MALLOC_TRIM_THRESHOLD_" not in os.environ or platform.libc_ver()[0] != "glibc":
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    done = mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD) and mallopt(_M_TOP_PAD, min(keep, 1 << 30))
    log.debug("distributed worker: malloc keeps up to %d freed bytes an arena (%s)", keep,
              "set" if done else "refused")
