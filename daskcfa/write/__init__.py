"""The write machinery that is not a task graph, shared by every writer.

``target.py``: preparing a write's target; ``request.py``: what a write is
asked to write; ``spec.py``: what a variable's fragments share and are
called; ``commit.py``: putting the aggregation file, its manifest and the
retirement of replaced fragments in place. Above ``storage/``, ``formats/``
and ``fragments/``; below ``graph/`` (whose ``write.py`` builds the task
graph from these parts) and the front ends.
"""
