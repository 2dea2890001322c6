"""storage/per_process.py: one object per process, a forked child's its own."""

from __future__ import annotations

import multiprocessing
import os
import threading

from daskcfa.storage.per_process import PerProcess

_MADE = PerProcess(lambda: (os.getpid(), threading.get_ident(), object()))


def _in_child(queue) -> None:
    first, second = _MADE.get(), _MADE.get()
    queue.put((first[0], first is second))


def test_made_once_in_a_process_and_again_in_a_forked_child():
    parent = _MADE.get()
    assert _MADE.get() is parent and parent[0] == os.getpid()
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_in_child, args=(queue,))
    child.start()
    made_for, kept = queue.get(timeout=60)
    child.join(60)
    assert made_for == child.pid and made_for != os.getpid() and kept
    assert _MADE.get() is parent
